"""The async collector around a refit: the batch in flight finishes first (or, with in-flight weight
updates, takes the new weights mid-generation, each token recording its version), and the outgoing
weights serve the next step first."""

from __future__ import annotations

import threading
import time

from rlplane.async_rl.staleness import version_token_counts
from rlplane.dataplane.columns import GENERATION_VERSIONS, TOKEN_MASK
from rlplane.models.configured import load_configured_policy

from .collector_helpers import P, counts, make_cfg, make_collector, wait_until


def test_refit_waits_for_the_batch_in_flight_and_blocks_new_starts():
    c, _ = make_collector("grpo.async_grpo.max_trajectory_age_steps=2")
    real = c.worker.backend.generate
    started, release = threading.Event(), threading.Event()

    def slow_generate(*args, **kwargs):
        started.set()
        release.wait(10)
        return real(*args, **kwargs)

    c.worker.backend.generate = slow_generate
    try:
        c.start()
        assert started.wait(10)
        done = threading.Event()
        t = threading.Thread(target=lambda: (c.prepare_for_refit(), done.set()))
        t.start()
        time.sleep(0.1)
        assert not done.is_set()  # the batch in flight is not cut short
        release.set()
        assert done.wait(20)
        # Its groups count from the refit on (being scored or buffered), and land in the buffer.
        assert c.stats()["buffer_size"] == P
        wait_until(lambda: c.counters["groups_generated"] == P)
        started.clear()
        time.sleep(0.3)
        assert not started.is_set() and c.counters["groups_generated"] == P  # no new start while refitting
        c.set_weight_version(1)
        c.resume_after_refit()
        # Version 0 got to step 0 only; version 1 (max_age 2) serves the rest: 1 (still short), 2, 3.
        wait_until(lambda: c.counters["groups_generated"] == 4 * P)
        assert counts(c) == {(0, 0): P, (1, 1): P, (1, 2): P, (1, 3): P}
    finally:
        release.set()
        c.stop()


def test_refit_lets_the_outgoing_weights_serve_the_next_step_first():
    c, _ = make_collector()
    real = c.worker.backend.generate
    calls, second, release = {"n": 0}, threading.Event(), threading.Event()

    def gated(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # version 0's batch for step 1
            second.set()
            release.wait(10)
        return real(*args, **kwargs)

    c.worker.backend.generate = gated
    try:
        c.start()
        assert second.wait(20)
        c.sample(P, current_version=0, timeout_s=20)  # the trainer's step 0
        done = threading.Event()
        t = threading.Thread(target=lambda: (c.prepare_for_refit(next_version=1), done.set()))
        t.start()
        time.sleep(0.2)
        assert not done.is_set()
        release.set()
        assert done.wait(20)
        # Step 1 was served by version 0 (age 1), whatever the threads' timing (generated before the
        # refit returned; its scoring may end after).
        wait_until(lambda: len(c.buffer) == P)
        assert counts(c) == {(0, 1): P}
    finally:
        release.set()
        c.stop()


def test_in_flight_refit_lands_mid_generation_and_tokens_record_their_version():
    c, _ = make_collector("grpo.async_grpo.in_flight_weight_updates=true")
    backend = c.worker.backend
    real_boundary, calls, reached = backend._swap.boundary, {"n": 0}, threading.Event()

    def boundary():
        calls["n"] += 1
        if calls["n"] == 3:  # before token 2's forward of the first batch: hold until the refit is handed over
            reached.set()
            while backend._swap._pending is None:
                time.sleep(0.001)
        return real_boundary()

    backend._swap.boundary = boundary
    model, _ = load_configured_policy(make_cfg().policy, seed=7)
    try:
        c.start()
        assert reached.wait(20)
        t0 = time.monotonic()
        c.prepare_for_refit(next_version=1)  # returns at once: the batch in flight keeps going
        assert c.schedule.generating is not None and time.monotonic() - t0 < 1.0
        c.update_weights({k: v.clone() for k, v in model.state_dict().items()}, version=1)
        c.set_weight_version(1)
        c.resume_after_refit()
        wait_until(lambda: len(c.buffer) >= P)
        c.pause()
        first = [g for g in c.buffer._groups if g.target_version == 0]
        assert len(first) == P
        for g in first:
            assert g.generation_version == 0  # its oldest token's version: its age counts from there
            cols = c.dp.get_samples(g.meta, None, [TOKEN_MASK, GENERATION_VERSIONS])
            for i, n in enumerate(g.meta.seq_lens):
                tm, vs = cols[TOKEN_MASK][i, :n], cols[GENERATION_VERSIONS][i, :n]
                gen = vs[tm == 1].tolist()
                assert gen == [0, 0, *[1] * (len(gen) - 2)][: len(gen)]  # flips exactly at token 2
                assert (vs[tm == 0] == -1).all()
                assert version_token_counts(g.carry)[i].tolist() == [gen.count(0), gen.count(1)]
        assert any(g.carry["version_tokens/1"].sum() > 0 for g in first)
    finally:
        c.stop()
