"""A short async GRPO run logs the age distribution of the tokens each step trains on."""

from __future__ import annotations

from rlplane.config.loading import load_config
from rlplane.recipes import async_grpo
from rlplane.utils.logging import read_metrics


def test_async_steps_log_token_ages(tmp_path, first_digit_env):
    cfg = load_config(None, [
        "grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=4", "policy.train_global_batch_size=16",
        "policy.train_micro_batch_size=16", "policy.logprob_batch_size=16", "grpo.max_num_steps=3",
        "grpo.val_period=0", "grpo.val_at_start=false", "grpo.val_at_end=false", "warmup.enabled=false",
        "logger.progress_bar=false", "logger.tensorboard_enabled=false", "grpo.async_grpo.enabled=true",
        "grpo.async_grpo.max_trajectory_age_steps=2", "loss_fn.use_importance_sampling_correction=true",
        f"run_dir={tmp_path}",
    ])
    async_grpo.train(cfg, quiet=True)
    rows = [r for r in read_metrics(tmp_path / "logs") if r["step"] > 0]
    assert len(rows) == 3
    for r in rows:
        shares = [r[f"train/tokens_from_version_minus_{k}"] for k in range(3)]  # 0..max_trajectory_age_steps
        assert abs(sum(shares) - 1) < 1e-9
        assert r["train/token_age/max"] <= r["train/max_trajectory_age"] <= 2
        assert r["train/token_age/p50"] <= r["train/token_age/max"]
        assert 0 <= r["train/token_age/mean"] <= r["train/token_age/max"]
    # Step 0 trains on the starting weights' own samples: every token is 0 versions old.
    assert rows[0]["train/tokens_from_version_minus_0"] == 1.0 and rows[0]["train/token_age/mean"] == 0.0
    # One group age per step here (each step's groups come from one version): token and group ages agree.
    for r in rows:
        assert r["train/token_age/mean"] == r["train/avg_trajectory_age"]
