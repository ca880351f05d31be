"""The async collector tests' shared pieces: a collector with the real tiny model and the exact-match
environment, and waits on its threads."""

from __future__ import annotations

import time

from rlplane.config.loading import load_config
from rlplane.dataplane import make_data_plane
from rlplane.datasets import build_datasets
from rlplane.models.configured import load_configured_policy
from tests.tiny import collector

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
    return collector(cfg, loader, start_version, data_plane=plane), loader


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
