"""Config values that used to be taken silently and do harm: refused in one line, with the fix."""

from __future__ import annotations

import pytest

from rlplane.config.loading import ConfigError, load_config


@pytest.mark.parametrize("key", ["policy.max_grad_norm", "value.max_grad_norm"])
@pytest.mark.parametrize("value", ["-1", "0", "-0.5"])
def test_a_non_positive_clip_norm_is_refused(key, value):
    """clip_grad_norm_ multiplies by max_norm / norm: -1 flipped every gradient (accuracy collapsed, exit 0)."""
    preset = "ppo_arithmetic" if key.startswith("value") else None
    with pytest.raises(ConfigError) as e:
        load_config(preset, [f"{key}={value}"])
    (line,) = str(e.value).splitlines()
    assert line.startswith(f"{key} = {float(value)} would flip or zero every gradient") and "null" in line


def test_null_turns_clipping_off_and_positive_values_pass():
    assert load_config(None, ["policy.max_grad_norm=null"]).policy.max_grad_norm is None
    assert load_config(None, ["policy.max_grad_norm=0.5"]).policy.max_grad_norm == 0.5


def test_a_duplicate_yaml_key_is_refused(tmp_path):
    """YAML keeps the last of two equal keys: a user's first setting vanished without a word."""
    f = tmp_path / "dup.yaml"
    f.write_text("defaults: grpo_arithmetic\ngrpo:\n  max_num_steps: 5\n  max_num_steps: 7\n")
    with pytest.raises(ConfigError, match=r"dup.yaml:4: not valid YAML \(key 'max_num_steps' given twice\)"):
        load_config(str(f))


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1])
def test_a_seed_beyond_64_bits_is_refused(seed):
    """torch.manual_seed raised 'Overflow when unpacking long long' at start-up (a traceback)."""
    with pytest.raises(ConfigError, match=r"grpo.seed: Input should be"):
        load_config(None, [f"grpo.seed={seed}"])
    load_config(None, [f"grpo.seed={2**64 - 1}"])


def test_grpo_with_one_generation_per_prompt_is_refused():
    """A group of one has advantage 0 under the group baseline: the run learned nothing, silently."""
    with pytest.raises(ConfigError, match=r"grpo.num_generations_per_prompt = 1: a group of one response has "
                                          r"advantage 0"):
        load_config(None, ["grpo.num_generations_per_prompt=1", "policy.train_global_batch_size=8",
                           "policy.train_micro_batch_size=8", "policy.logprob_batch_size=8"])
    # Estimators with a batch-wide baseline, and PPO (a critic), still take it.
    load_config(None, ["grpo.num_generations_per_prompt=1", "grpo.adv_estimator.name=reinforce_plus_plus",
                       "policy.train_global_batch_size=8", "policy.train_micro_batch_size=8",
                       "policy.logprob_batch_size=8"])


@pytest.mark.parametrize("value", ["-0.1", "1", "2"])
def test_env_max_error_rate_is_a_share_below_one(value):
    with pytest.raises(ConfigError, match="env.max_error_rate"):
        load_config(None, [f"env.max_error_rate={value}"])
