"""A reward control runs through the recipes' own code: the same rollouts, rewards that say nothing."""

from __future__ import annotations

import pytest

from rlplane.cli import main
from rlplane.config.loading import load_config
from rlplane.errors import ConfigError
from rlplane.utils.logging import read_metrics

RUN = ["warmup.enabled=false", "{loop}.num_prompts_per_step=4", "{loop}.num_generations_per_prompt=4",
       "policy.train_global_batch_size=16", "policy.train_micro_batch_size=16", "policy.logprob_batch_size=16",
       "{loop}.max_num_steps=3", "{loop}.val_period=0", "{loop}.val_at_start=false", "{loop}.max_val_samples=8",
       "{loop}.val_batch_size=8", "policy.tiny.hidden_size=32", "policy.tiny.intermediate_size=32",
       "policy.tiny.num_layers=1", "logger.tensorboard_enabled=false", "checkpointing.enabled=false"]


def _run(tmp_path, name: str, preset: str, loop: str, extra: list[str]) -> list[dict]:
    overrides = [o.replace("{loop}", loop) for o in RUN]
    assert main(["train", "--quiet", "-c", preset, *overrides, *extra, f"run_dir={tmp_path / name}"]) == 0
    return [r for r in read_metrics(tmp_path / name / "logs") if "train/reward" in r]


@pytest.mark.parametrize("preset, loop, extra", [
    ("grpo_arithmetic", "grpo", []),
    ("grpo_arithmetic_async", "grpo", []),
    ("ppo_arithmetic", "ppo", ["ppo.policy_training_start_step=0", "ppo.ppo_epochs=1"]),
])
def test_a_control_sees_the_same_first_rollouts_and_trains_on_other_rewards(tmp_path, preset, loop, extra,
                                                                            first_digit_env):
    real = _run(tmp_path, "real", preset, loop, extra)
    for kind in ("permute", "coin"):
        control = _run(tmp_path, kind, preset, loop, [*extra, f"{loop}.reward_control={kind}"])
        # Step 1: the same weights generated the same samples, and train/reward is the task's in both.
        assert control[0]["train/reward"] == real[0]["train/reward"]
        # The rewards the step trained on were others: the update, and so step 2's samples, differ.
        assert [r["train/loss"] for r in control] != [r["train/loss"] for r in real], kind


def test_distillation_has_no_reward_to_control():
    with pytest.raises(ConfigError, match="distillation.reward_control = permute: distillation trains on the "
                                          "teacher's logprobs"):
        load_config("distill_arithmetic", ["distillation.reward_control=permute"])
    with pytest.raises(ConfigError, match="grpo.reward_control: .*'permute' or 'coin'|reward_control"):
        load_config(None, ["grpo.reward_control=shuffle"])
