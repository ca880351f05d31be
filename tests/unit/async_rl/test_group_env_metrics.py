"""Async GRPO's per-environment metrics are exact: each buffered group carries the env/<task>/* metrics of
its own samples, and a step merges those of exactly the groups it trains (whatever batch or weight
version they came from); a batch's actor deaths are counted once, with its first kept group."""

from __future__ import annotations

import time

import pytest
import torch

from rlplane.async_rl.collector import group_env_metrics
from rlplane.config.loading import load_config
from rlplane.dataplane import make_data_plane
from rlplane.datasets import build_datasets
from rlplane.envs.interface import EnvBatch, default_env_metrics
from rlplane.models.configured import load_configured_policy
from rlplane.recipes.async_grpo import merge_rollout_metrics
from rlplane.workers.rollout import ENV_GROUPS
from tests.tiny import collector

P, G = 3, 2


def _collector():
    cfg = load_config(None, [
        f"grpo.num_prompts_per_step={P}", f"grpo.num_generations_per_prompt={G}",
        f"policy.train_global_batch_size={P * G}", "data.num_train_samples=64", "policy.generation.max_new_tokens=6",
        "grpo.async_grpo.enabled=true", "loss_fn.use_importance_sampling_correction=true"])
    _, tok = load_configured_policy(cfg.policy, cfg.loop.seed)
    loader, _, _ = build_datasets(cfg.dataset_options(), tok)
    return collector(cfg, loader, 0, data_plane=make_data_plane("memory"))


def _expected(groups) -> dict[str, float]:
    """The default environment metrics computed over the given groups' samples at once."""
    cat = {k: torch.cat([g.carry[k] for g in groups]) for k in ("rewards", "truncated", "prompt_lengths",
                                                                 "response_lengths")}
    batch = EnvBatch(torch.arange(len(groups)).repeat_interleave(G), cat["truncated"], cat["prompt_lengths"],
                     cat["response_lengths"])
    out = {f"env/arithmetic/{k}": v for k, v in default_env_metrics(cat["rewards"], batch).items()}
    out["env/arithmetic/num_samples"] = float(len(groups) * G)
    return out


def _env(metrics):
    return {k: v for k, v in metrics.items() if k.startswith("env/") and not k.endswith("actor_deaths")}


def test_a_step_of_part_of_a_batch_gets_exactly_its_own_samples_env_metrics():
    c = _collector()
    try:
        c.start()
        t0 = time.monotonic()
        while c.counters["groups_generated"] < 2 * P:
            assert time.monotonic() - t0 < 60
            time.sleep(0.02)
        c.pause()
        groups = c.sample(P, current_version=0).groups + c.sample(P, current_version=1).groups
    finally:
        c.stop()
    for g in groups:
        assert _env(g.rollout_metrics) == pytest.approx(_expected([g]), abs=1e-6)
    # Any selection of groups (parts of two batches here) merges to the metrics of exactly those samples.
    for chosen in (groups[:1], groups[1:4], groups):
        assert _env(merge_rollout_metrics(chosen)) == pytest.approx(_expected(chosen), abs=1e-6)


def test_a_batchs_actor_deaths_go_to_its_first_kept_group_once():
    metrics = {"reward": 0.5, "env/a/actor_deaths": 2.0, ENV_GROUPS: [{"env/a/num_samples": 2.0}] * 3}
    parts = group_env_metrics(metrics, failed=[True, False, False])
    assert metrics == {"reward": 0.5}
    assert parts == [{"env/a/num_samples": 2.0}, {"env/a/num_samples": 2.0, "env/a/actor_deaths": 2.0},
                     {"env/a/num_samples": 2.0}]
