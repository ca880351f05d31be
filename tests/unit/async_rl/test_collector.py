"""AsyncTrajectoryCollector with the real tiny model and the exact-match environment: targets per
weight version, pause, eviction, generation failures, the groups' columns in the shared data plane
(evicted ones cleared, checkpointed ones written back)."""

from __future__ import annotations

import time

import torch

from rlplane.async_rl import target_versions
from rlplane.async_rl.staleness import version_token_counts
from rlplane.dataplane.columns import GENERATION_LOGPROBS, GENERATION_VERSIONS, INPUT_IDS, ROLLOUT_COLUMNS, TOKEN_MASK
from rlplane.models.configured import load_configured_policy

from .collector_helpers import G, P, counts, make_cfg, make_collector, wait_until


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


def test_get_weight_version_follows_the_swaps():
    # NeMo RL's collector method: the version the generator holds (the start version, then each swap's).
    c, _ = make_collector(start_version=3)
    try:
        assert c.get_weight_version() == 3
        c.set_weight_version(4)
        assert c.get_weight_version() == 4
    finally:
        c.stop()
