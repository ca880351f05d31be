"""The collector resumed with a changed group size or age bound (the saved buffer is fitted, never a crash),
and drop_group's dropped draws reaching the step's prompts ledger (drawn, never trained)."""

from __future__ import annotations

import dataclasses
import time

import torch

from rlplane.async_rl.staleness import group_token_ages
from rlplane.config.loading import load_config
from rlplane.dataplane import KVBatchMeta, make_data_plane
from rlplane.datasets import build_datasets
from rlplane.envs import ENV_REGISTRY, EnvironmentReturn, register_env
from rlplane.models.configured import load_configured_policy
from rlplane.recipes.async_grpo import step_carry
from tests.tiny import collector

P = 2


def make_collector(G=2, *extra, start_version=0):
    cfg = load_config(None, [
        f"grpo.num_prompts_per_step={P}", f"grpo.num_generations_per_prompt={G}",
        f"policy.train_global_batch_size={P * G}", "data.num_train_samples=64",
        "grpo.async_grpo.enabled=true", "loss_fn.use_importance_sampling_correction=true", *extra,
    ])
    _, tok = load_configured_policy(cfg.policy, cfg.loop.seed)
    loader, _, _ = build_datasets(cfg.dataset_options(), tok)
    plane = make_data_plane("memory")
    return collector(cfg, loader, start_version, data_plane=plane)


def wait_until(cond, timeout=30.0):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.01)


def saved_after_step_0(*extra):
    """A checkpoint after step 0: the buffer holds step 1's P groups."""
    c = make_collector(2, *extra)
    try:
        c.start()
        wait_until(lambda: c.counters["groups_generated"] == 2 * P)
        c.sample(P, current_version=0)
        return c.state_dict()
    finally:
        c.stop()


def test_step_carry_labels_each_group_by_its_own_size():
    def group(n):
        return dataclasses.make_dataclass("G", ["meta", "carry"])(
            KVBatchMeta("train", None, [f"k{i}" for i in range(n)]), {"rewards": torch.zeros(n)})

    assert step_carry([group(2), group(3)])["group"].tolist() == [0, 0, 1, 1, 1]


def test_resume_with_another_group_size_draws_the_buffered_prompts_again():
    state = saved_after_step_0()
    saved = [(g["epoch"], g["prompt_idx"]) for g in state["replay_buffer"]["groups"]]
    assert len(saved) == P
    d = make_collector(3, start_version=1)
    assert d.load_state_dict(state, current_version=1) == 0 and len(d.buffer) == 0
    assert [(x.epoch, x.idx) for x in list(d._pending)[:P]] == saved  # first in line, drawn again
    assert d.restore_note() == (f"; {P} groups of 2 samples left out, their prompts drawn again at 3 "
                                "(grpo.num_generations_per_prompt changed)")
    try:
        d.start()
        wait_until(lambda: d.counters["groups_generated"] >= P)
        out = d.sample(P, current_version=1, timeout_s=30)
        assert [(g.epoch, g.prompt_idx) for g in out.groups] == sorted(saved)
        assert all(len(g.meta) == 3 for g in out.groups) and out.evicted == 0 and out.dropped_prompts == []
        assert step_carry(out.groups)["group"].tolist() == [0, 0, 0, 1, 1, 1]
    finally:
        d.stop()


def test_resume_with_another_age_bound_respans_the_version_carries():
    state = saved_after_step_0()
    d = make_collector(2, "grpo.async_grpo.max_trajectory_age_steps=2", start_version=1)
    assert d.load_state_dict(state, current_version=1) == 0 and len(d.buffer) == P
    try:
        d.start()  # steps 2 and 3 generated at the new bound beside the restored step 1
        wait_until(lambda: d.counters["groups_generated"] == 2 * P)
        d.pause()
        groups = list(d.buffer._groups)
        assert {g.target_version for g in groups} == {1, 2, 3}
        keys = {k for k in groups[0].carry if k.startswith("version_tokens/")}
        assert keys == {"version_tokens/0", "version_tokens/1", "version_tokens/2"}
        assert all(g.carry.keys() == groups[0].carry.keys() for g in groups)
        ages, tokens = group_token_ages(groups, 1)  # restored and new groups side by side
        assert len(ages) == len(groups) * 2 * 3 and float(tokens.sum()) > 0
    finally:
        d.stop()
    assert d.restore_note() == (f"; {P} groups' token version counts re-spanned to 3 versions "
                                "(grpo.async_grpo.max_trajectory_age_steps changed)")


class FailsOnSomeAnswers:
    """Reward 1 for an odd first digit; raises on prompts whose answer ends in 3 or 7 (their groups fail)."""

    def step(self, message_logs, metadata):
        from rlplane.envs import last_assistant_content

        if any(str(m["ground_truth"])[-1] in "37" for m in metadata):
            raise RuntimeError("scorer crashed")
        texts = [last_assistant_content(m) for m in message_logs]
        rewards = torch.tensor([float(t[:1] in "13579" and t[:1] != "") for t in texts])
        n = len(texts)
        return EnvironmentReturn([{}] * n, [None] * n, [None] * n, rewards, torch.ones(n, dtype=torch.bool), None)


def test_drop_group_names_each_dropped_draw_once_in_the_next_sample():
    saved = dict(ENV_REGISTRY)
    register_env("arithmetic", FailsOnSomeAnswers)
    try:
        c = make_collector(2, "grpo.rollout_failure_policy=drop_group", "grpo.async_grpo.max_generation_failures=50")
        try:
            c.start()
            wait_until(lambda: c.counters["groups_generated"] == 2 * P, timeout=120)
            c.pause()
            dropped = c.counters["dropped_groups"]
            r0, r1 = c.sample(P, current_version=0), c.sample(P, current_version=1)
            pending = [[d.epoch, d.idx] for d in c._pending]
            answers = {d.idx: str(d.extra_env_info["ground_truth"]) for d in c.loader.dataset}
        finally:
            c.stop()
    finally:
        ENV_REGISTRY.clear()
        ENV_REGISTRY.update(saved)
    assert dropped > 0 and r1.dropped_prompts == []  # all reported by the first sample
    assert len(r0.dropped_prompts) == dropped and all(answers[i][-1] in "37" for _, i in r0.dropped_prompts)
    ledger = [*r0.dropped_prompts, *([g.epoch, g.prompt_idx] for r in (r0, r1) for g in r.groups), *pending]
    fresh = make_collector(2).loader
    drawn = [[d.epoch, d.idx] for _ in range(len(ledger) // P + 1) for d in next(fresh)]
    assert sorted(ledger) == sorted(drawn[: len(ledger)])  # every draw once: trained, dropped or pending


def test_the_fitted_keys_are_classed_convertible():
    from rlplane.config.resume import CONVERTIBLE, classify

    assert classify("grpo.num_generations_per_prompt")[0] == CONVERTIBLE
    assert classify("grpo.async_grpo.max_trajectory_age_steps")[0] == CONVERTIBLE
