"""AsyncTrajectoryCollector with the real tiny model and the exact-match environment: targets per
weight version, pause/resume around a refit, failures injected into the generation backend, the
groups' columns in the shared data plane (evicted ones cleared, checkpointed ones written back)."""

from __future__ import annotations

import threading
import time

import torch

from rlplane.async_rl import AsyncTrajectoryCollector, target_versions
from rlplane.async_rl.staleness import version_token_counts
from rlplane.config.loading import load_config
from rlplane.dataplane import make_data_plane
from rlplane.dataplane.columns import GENERATION_LOGPROBS, GENERATION_VERSIONS, INPUT_IDS, ROLLOUT_COLUMNS, TOKEN_MASK
from rlplane.datasets import build_datasets
from rlplane.models.configured import load_configured_policy

P, G = 2, 2


def make_cfg(*extra):
    return load_config(None, [
        f"grpo.num_prompts_per_step={P}", f"grpo.num_generations_per_prompt={G}",
        f"policy.train_global_batch_size={P * G}", "data.num_train_samples=64",
        "grpo.async_grpo.enabled=true", "loss_fn.use_importance_sampling_correction=true", *extra,
    ])


def make_collector(*extra, start_version=0):
    cfg = make_cfg(*extra)
    _, tok = load_configured_policy(cfg.policy, cfg.loop.seed)
    loader, _, _ = build_datasets(cfg.dataset_options(), tok)
    plane = make_data_plane("memory")  # the run's shared plane; the collector registers its partition
    return AsyncTrajectoryCollector(cfg, loader, start_version, seed=0, data_plane=plane, partition_id="train"), loader


def wait_until(cond, timeout=20.0):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.01)


def counts(c):
    out = {}
    for g in list(c.buffer._groups):
        out[(g.generation_version, g.target_version)] = out.get((g.generation_version, g.target_version), 0) + 1
    return out


def test_target_versions():
    # Its own step (only while still short) and the next max_age steps.
    assert target_versions(0, max_age_steps=1) == [0, 1]
    assert target_versions(10, max_age_steps=4) == [10, 11, 12, 13, 14]


def test_collector_fills_targets_then_idles_and_follows_refits():
    c, _ = make_collector()
    try:
        c.start()
        # Version 0 serves steps 0 and 1, then every target is covered: it idles.
        wait_until(lambda: c.counters["groups_generated"] == 2 * P)
        time.sleep(0.3)
        assert c.counters["groups_generated"] == 2 * P
        assert counts(c) == {(0, 0): P, (0, 1): P}
        first = c.sample(P, current_version=0)
        assert [g.generation_version for g in first.groups] == [0] * P and first.avg_trajectory_age == 0
        g = first.groups[0]
        assert len(g.meta) == G and g.carry["rewards"].shape == (G,)
        # The columns are in the shared plane under the group's keys (target 0, first batch, its prompt).
        assert g.meta.sample_ids == tuple(f"t0/b1/e0/p{g.prompt_idx}_g{i}" for i in range(G))
        cols = c.dp.get_samples(g.meta, None, list(ROLLOUT_COLUMNS))
        # Token mask marks the response; generation logprobs are 0 on the prompt and < 0 on the response.
        n = g.meta.seq_lens[0]
        tm, lp = cols[TOKEN_MASK][0, :n], cols[GENERATION_LOGPROBS][0, :n]
        assert cols[INPUT_IDS].shape[0] == G and (lp[tm == 0] == 0).all() and (lp[tm == 1] < 0).all()
        assert g.carry["generated_tokens"].tolist() == cols[TOKEN_MASK].sum(dim=1).tolist()

        # Refit to version 1: serves steps 1 (already covered by version 0) and 2.
        model, _ = load_configured_policy(make_cfg().policy, seed=7)
        new = {k: v.clone() for k, v in model.state_dict().items()}
        c.prepare_for_refit()
        c.update_weights(new)
        c.set_weight_version(1)
        c.resume_after_refit()
        for k, v in c.worker.backend.model.state_dict().items():
            assert torch.equal(v, new[k]), k
        wait_until(lambda: counts(c).get((1, 2), 0) == P)
        second = c.sample(P, current_version=1)
        assert [g.generation_version for g in second.groups] == [0] * P and second.avg_trajectory_age == 1.0
        # Every prompt drawn from the loader is accounted for, once.
        seen = [g.prompt_idx for g in first.groups + second.groups] + [g.prompt_idx for g in c.buffer._groups]
        assert len(seen) == len(set(seen)) == 3 * P
    finally:
        c.stop()


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


def test_generation_failures_are_retried_without_losing_prompts():
    c, _ = make_collector("grpo.async_grpo.max_generation_failures=2")
    real = c.worker.backend.generate
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] <= 2:
            raise RuntimeError("backend lost")
        return real(*args, **kwargs)

    c.worker.backend.generate = flaky
    try:
        c.start()
        wait_until(lambda: c.counters["groups_generated"] == 2 * P)
        assert c.health() is None and c.counters["failures"] == 2
        # The failed batch's prompts were generated on retry, in order: the loader's first two batches.
        ids = [g.prompt_idx for g in c.buffer._groups]
        c2, loader2 = make_collector()
        expected = [d.idx for _ in range(2) for d in next(loader2)]
        assert ids == expected
    finally:
        c.stop()


def test_too_many_failures_stop_the_collector_with_a_one_line_reason():
    c, _ = make_collector("grpo.async_grpo.max_generation_failures=1")

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: device lost")

    c.worker.backend.generate = broken
    try:
        c.start()
        wait_until(lambda: c.health() is not None)
        msg = c.health()
        assert "\n" not in msg
        assert msg.startswith("async collector: generation failed 2 times in a row")
        assert "max_generation_failures = 1" in msg and "RuntimeError: CUDA error: device lost" in msg
        assert "broken" in c.error_traceback()
        assert c.sample(P, current_version=0, timeout_s=0) is None
    finally:
        c.stop()


def test_state_dict_restores_buffer_loader_and_pending_prompts(tmp_path):
    c, _ = make_collector()
    try:
        c.start()
        wait_until(lambda: c.counters["groups_generated"] == 2 * P)
        used = c.sample(P, current_version=0)
        c.save_state(str(tmp_path / "replay_buffer.pt"))  # the columns read back from the plane, into the file
        saved = {g.meta.sample_ids: c.dp.get_samples(g.meta, None, list(ROLLOUT_COLUMNS)) for g in c.buffer._groups}
    finally:
        c.stop()
    state = torch.load(tmp_path / "replay_buffer.pt", weights_only=True)
    assert len(state["replay_buffer"]["groups"]) == P
    d, _ = make_collector(start_version=1)  # a fresh plane: a resumed run's
    assert d.load_state(str(tmp_path / "replay_buffer.pt"), current_version=1) == (P, 0)
    # Written back under the same keys, the same columns.
    for g in d.buffer._groups:
        back = d.dp.get_samples(g.meta, None, list(ROLLOUT_COLUMNS))
        assert all(torch.equal(back[k], saved[g.meta.sample_ids][k]) for k in ROLLOUT_COLUMNS)
    try:
        d.start()
        # Resumed at version 1: serves steps 1 (covered by the restored groups) and 2 (needs P).
        wait_until(lambda: d.counters["groups_generated"] == P)
        time.sleep(0.2)
        assert d.counters["groups_generated"] == P
        ids = [g.prompt_idx for g in used.groups] + [g.prompt_idx for g in d.buffer._groups]
        c3, loader3 = make_collector()
        assert ids == [x.idx for _ in range(3) for x in next(loader3)]
        # The batch counter went on from the checkpoint's: no key of the new batch repeats an old one.
        assert {k for g in d.buffer._groups for k in g.meta.sample_ids}.isdisjoint(saved) and d.schedule.started == 3
    finally:
        d.stop()


def test_evicted_groups_are_cleared_from_the_data_plane():
    c, _ = make_collector()
    try:
        c.start()
        wait_until(lambda: c.counters["groups_generated"] == 2 * P)
        c.pause()
        stale = [g.meta for g in c.buffer._groups if g.target_version == 0]
        assert len(stale) == P
        # The trainer skips to step 1: step 0's groups missed their step and are evicted, keys and all.
        out = c.sample(P, current_version=1)
        assert out.evicted == P and all(g.target_version == 1 for g in out.groups)
        live = set(c.dp.list_samples("train"))
        assert live == {k for g in out.groups for k in g.meta.sample_ids}
        assert live.isdisjoint(k for m in stale for k in m.sample_ids)
    finally:
        c.stop()


def test_pause_holds_new_generation_until_resume():
    c, _ = make_collector()
    try:
        c.start()
        c.pause()  # returns once any batch in flight has landed
        n = c.counters["groups_generated"]
        assert n in (0, P)
        time.sleep(0.3)
        assert c.counters["groups_generated"] == n
        c.resume()
        wait_until(lambda: c.counters["groups_generated"] == 2 * P)
    finally:
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


def test_a_checkpoint_without_token_versions_restores_with_the_groups_version(tmp_path):
    c, _ = make_collector()
    try:
        c.start()
        wait_until(lambda: c.counters["groups_generated"] == 2 * P)
        c.sample(P, current_version=0)
        state = c.state_dict()
    finally:
        c.stop()
    for g in state["replay_buffer"]["groups"]:  # as a checkpoint written before per-token versions
        del g["columns"][GENERATION_VERSIONS], g["carry"]["oldest_version"]
        del g["carry"]["version_tokens/0"], g["carry"]["version_tokens/1"]
    d, _ = make_collector(start_version=1)
    d.load_state_dict(state, current_version=1)
    for g in d.buffer._groups:
        tm, vs = (d.dp.get_samples(g.meta, None, [TOKEN_MASK, GENERATION_VERSIONS])[k] for k in (TOKEN_MASK,
                                                                                                 GENERATION_VERSIONS))
        assert (vs[tm == 1] == 0).all() and g.carry["oldest_version"].tolist() == [0] * G
        # max_age 1: two columns (age offsets 0, 1); every generated token in the first.
        assert version_token_counts(g.carry).tolist() == [[n, 0] for n in g.carry["generated_tokens"].tolist()]


class GatedJudge:
    """The collector's environment, its every step held until ``release`` is set (a slow judge)."""

    def __init__(self, collector):
        self.real_env, self.judging, self.release = collector.worker.env, threading.Event(), threading.Event()
        self.cache = {}
        collector.worker.env = self.env

    def env(self, task_name, validation=False):
        if task_name not in self.cache:
            real, gate = self.real_env(task_name), self

            class Gated:
                reward_component_names = getattr(real, "reward_component_names", ())

                def step(self, message_logs, metadata):
                    gate.judging.set()
                    assert gate.release.wait(20)
                    return real.step(message_logs, metadata)

            self.cache[task_name] = Gated()
        return self.cache[task_name]


def count_generate_calls(collector):
    real, calls = collector.worker.backend.generate, {"n": 0}

    def counted(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    collector.worker.backend.generate = counted
    return calls


def test_next_batch_generates_and_refit_goes_ahead_while_a_batch_is_scored():
    c, _ = make_collector()
    judge, calls = GatedJudge(c), count_generate_calls(c)
    try:
        c.start()
        assert judge.judging.wait(20)  # step 0's batch is scored (held)
        # Step 1's batch (version 0 serves steps 0 and 1) generates meanwhile: the judge is not the
        # collector's whole cycle. Before, it waited for step 0's scoring.
        wait_until(lambda: calls["n"] == 2)
        c.sample(P, current_version=0, timeout_s=0.0)  # step 0 not ready: still being scored
        # The refit waits for step 1's generation only; both batches are still scored (held).
        c.prepare_for_refit(next_version=1)
        assert len(c.buffer) == 0 and c.stats()["buffer_size"] == 2 * P
        c.update_weights({k: v.clone() for k, v in c.worker.backend.model.state_dict().items()}, version=1)
        c.set_weight_version(1)
        c.resume_after_refit()
        judge.release.set()
        # Scored and buffered in the order the batches started, each by the weights it was due to.
        step0 = c.sample(P, current_version=0, timeout_s=20)  # the buffer holds 2 steps: room for step 2's
        assert [(g.generation_version, g.target_version) for g in step0.groups] == [(0, 0)] * P
        wait_until(lambda: len(c.buffer) == 2 * P)
        assert [(g.generation_version, g.target_version) for g in c.buffer._groups] == [(0, 1)] * P + [(1, 2)] * P
    finally:
        judge.release.set()
        c.stop()


def test_drop_group_refit_waits_for_the_scoring():
    # A dropped group is regenerated by the weights of its batch only if the refit waits for the scoring.
    c, _ = make_collector("grpo.rollout_failure_policy=drop_group")
    judge, calls = GatedJudge(c), count_generate_calls(c)
    try:
        c.start()
        assert judge.judging.wait(20)
        time.sleep(0.3)
        assert calls["n"] == 1  # no generation beside the scoring
        done = threading.Event()
        t = threading.Thread(target=lambda: (c.prepare_for_refit(), done.set()))
        t.start()
        time.sleep(0.2)
        assert not done.is_set()
        judge.release.set()
        assert done.wait(20) and len(c.buffer) == P  # in the buffer before the refit went ahead
    finally:
        judge.release.set()
        c.stop()


class TrackingJudge:
    """The collector's environment, recording how many of its step calls run at once (``peak``) and the
    order they end in; the first call is held until ``release`` is set (a slow judge on batch 1)."""

    def __init__(self, collector):
        self.real_env, self.release = collector.worker.env, threading.Event()
        self.lock, self.active, self.peak, self.calls, self.ended = threading.Lock(), 0, 0, 0, []
        self.cache = {}
        collector.worker.env = self.env

    def env(self, task_name, validation=False):
        if task_name not in self.cache:
            real, judge = self.real_env(task_name), self

            class Tracked:
                reward_component_names = getattr(real, "reward_component_names", ())

                def step(self, message_logs, metadata):
                    with judge.lock:
                        judge.calls += 1
                        call, judge.active = judge.calls, judge.active + 1
                        judge.peak = max(judge.peak, judge.active)
                    try:
                        if call == 1:
                            assert judge.release.wait(20)
                        return real.step(message_logs, metadata)
                    finally:
                        with judge.lock:
                            judge.active -= 1
                            judge.ended.append(call)

            self.cache[task_name] = Tracked()
        return self.cache[task_name]


def test_one_batch_is_scored_at_a_time_by_default():
    c, _ = make_collector()
    judge, calls = TrackingJudge(c), count_generate_calls(c)
    try:
        c.start()
        wait_until(lambda: calls["n"] == 2)  # batch 2 generated while batch 1 is scored (held)
        time.sleep(0.3)
        assert judge.peak == 1 and judge.calls == 1  # batch 2 waits: the environment need not be thread-safe
        judge.release.set()
        wait_until(lambda: len(c.buffer) == 2 * P)
        assert judge.peak == 1
    finally:
        judge.release.set()
        c.stop()


def test_two_batches_are_scored_at_once_and_still_buffered_in_start_order():
    c, _ = make_collector("grpo.async_grpo.max_concurrent_scoring=2")
    judge, loader2 = TrackingJudge(c), make_collector()[1]
    try:
        c.start()
        # Batch 2 (step 1) is scored while batch 1 (step 0) is held in its judge, and finishes first ...
        wait_until(lambda: judge.ended == [2])
        assert judge.peak == 2
        time.sleep(0.2)
        assert len(c.buffer) == 0 and c.stats()["buffer_size"] == 2 * P  # ... but waits for its turn
        judge.release.set()
        wait_until(lambda: len(c.buffer) == 2 * P)
        # Start order: step 0's groups (the loader's first prompts) before step 1's.
        assert [g.target_version for g in c.buffer._groups] == [0] * P + [1] * P
        assert [g.prompt_idx for g in c.buffer._groups] == [d.idx for _ in range(2) for d in next(loader2)]
    finally:
        judge.release.set()
        c.stop()


def test_a_batch_failing_after_its_scoring_does_not_hold_up_the_next():
    c, loader2 = make_collector("grpo.async_grpo.max_concurrent_scoring=2")[0], make_collector()[1]
    judge, real, n = TrackingJudge(c), c.worker.score, {"calls": 0}

    def first_fails(*args, **kwargs):
        n["calls"] += 1
        call = n["calls"]
        out = real(*args, **kwargs)
        if call == 1:
            raise RuntimeError("lost after scoring")
        return out

    c.worker.score = first_fails
    try:
        c.start()
        wait_until(lambda: judge.ended == [2])  # batch 2 scored, waiting for batch 1's turn
        judge.release.set()  # batch 1 then fails: it passes its turn, its prompts go back
        wait_until(lambda: len(c.buffer) == 2 * P)
        assert c.health() is None and c.counters["failures"] == 1
        # Step 1's groups (batch 2) first; step 0 regenerated from batch 1's prompts, put back.
        first, second = next(loader2), next(loader2)
        assert [(g.target_version, g.prompt_idx) for g in c.buffer._groups] == \
            [(1, d.idx) for d in second] + [(0, d.idx) for d in first]
    finally:
        judge.release.set()
        c.stop()


def test_a_batch_decodes_its_responses_while_the_one_before_it_is_scored():
    # The scoring turn holds the environment step only: batch 2 decodes its responses (and builds its
    # message logs) beside batch 1's scoring, so that work is not added to the judge's latency.
    c, _ = make_collector()
    judge, decoded, real = TrackingJudge(c), {"n": 0}, c.worker.tokenizer.decode

    def counted(*args, **kwargs):
        decoded["n"] += 1
        return real(*args, **kwargs)

    c.worker.tokenizer.decode = counted
    try:
        c.start()
        wait_until(lambda: decoded["n"] == 2 * P * G, timeout=10)  # both batches' responses, batch 1 held
        assert judge.calls == 1 and judge.peak == 1  # batch 2 is still waiting to score
        judge.release.set()
        wait_until(lambda: len(c.buffer) == 2 * P)
    finally:
        judge.release.set()
        c.stop()


def test_the_next_batch_scores_while_one_writes_its_columns_and_they_still_buffer_in_start_order():
    # Writing the columns to the data plane (and making the groups) happens after the scoring turn:
    # batch 2 is scored while batch 1 is held in its write, and batch 1's groups still go in first.
    c, loader2 = make_collector()[0], make_collector()[1]
    judge, real, held, release = TrackingJudge(c), c.worker.dp.put_samples, threading.Event(), threading.Event()
    judge.release.set()  # no judge held: the first write is

    def first_held(*args, **kwargs):
        if not held.is_set():
            held.set()
            assert release.wait(20)
        return real(*args, **kwargs)

    c.worker.dp.put_samples = first_held
    try:
        c.start()
        assert held.wait(20)  # batch 1 scored, its columns not yet written
        wait_until(lambda: judge.calls == 2, timeout=10)  # batch 2 scored meanwhile
        time.sleep(0.2)
        assert len(c.buffer) == 0  # batch 2 waits for batch 1 to fill the buffer first
        release.set()
        wait_until(lambda: len(c.buffer) == 2 * P)
        assert [g.target_version for g in c.buffer._groups] == [0] * P + [1] * P
        assert [g.prompt_idx for g in c.buffer._groups] == [d.idx for _ in range(2) for d in next(loader2)]
    finally:
        release.set()
        c.stop()


def test_get_weight_version_follows_the_swaps():
    # NeMo RL's collector method: the version the generator holds (the start version, then each swap's).
    c, _ = make_collector(start_version=3)
    try:
        assert c.get_weight_version() == 3
        c.set_weight_version(4)
        assert c.get_weight_version() == 4
    finally:
        c.stop()
