"""GRPO end to end with sequence packing / dynamic batching (issue 19): finite metrics, and the first
step on-policy (the generator's logprobs equal the packed training forward's, so no sequence attends
to another), with the KL term on and top-k sampling (the forward returns filtered and unfiltered)."""

from __future__ import annotations

import math

import pytest

from rlplane.config.loading import load_config
from rlplane.recipes.grpo import train
from rlplane.utils.logging import read_metrics


@pytest.mark.parametrize("mode", ["sequence_packing", "dynamic_batching"])
def test_grpo_with_packing_logs_finite_on_policy_metrics(tmp_path, mode):
    cfg = load_config(None, [
        "warmup.enabled=false", "grpo.num_prompts_per_step=8", "grpo.num_generations_per_prompt=4",
        "policy.train_global_batch_size=16", "policy.train_micro_batch_size=8", "policy.logprob_batch_size=16",
        "grpo.max_num_steps=2", "grpo.val_period=0", "grpo.val_at_start=false", "grpo.max_val_samples=16",
        "grpo.val_batch_size=16", "logger.progress_bar=false", "logger.tensorboard_enabled=false",
        "checkpointing.enabled=false", "loss_fn.reference_policy_kl_penalty=0.01", "policy.generation.top_k=8",
        f"policy.{mode}.enabled=true", f"policy.{mode}.train_mb_tokens=64", f"run_dir={tmp_path}",
        # Rows of 48: three or four arithmetic sequences (10-16 tokens) share one.
        *(["policy.sequence_packing.row_tokens=48"] if mode == "sequence_packing" else [])])
    train(cfg, quiet=True)
    steps = [r for r in read_metrics(tmp_path / "logs") if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        for key in ("train/loss", "train/token_mult_prob_error", "train/kl_penalty", "train/grad_norm"):
            assert key in r and math.isfinite(r[key]), key
    # Two optimizer steps per rollout (GBS 16 of 32 samples): the prev-logprob forward runs, packed as well.
    assert abs(steps[0]["train/token_mult_prob_error"] - 1.0) < 1e-3
