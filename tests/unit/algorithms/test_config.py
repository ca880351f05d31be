"""Config models for the RL math: NeMo RL defaults, kwargs match the kernels, one-line errors."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from pydantic import ValidationError

from rlplane.algorithms import ClippedPGOptions, apply_reward_shaping, clipped_pg_loss, compute_gae, scale_rewards
from rlplane.algorithms.loss_options import DistillationLossOptions
from rlplane.config.algorithms import (
    GRPOAdvEstimatorConfig,
    LossConfig,
    PPOAdvEstimatorConfig,
    RewardScalingConfig,
    RewardShapingConfig,
)


def kwonly_defaults(fn, skip=()):
    sig = inspect.signature(fn)
    return {k: p.default for k,
            p in sig.parameters.items() if p.default is not inspect.Parameter.empty and k not in skip}


def test_loss_config_defaults_are_nemo_rl_and_match_the_kernel():
    cfg = LossConfig()
    assert (cfg.ratio_clip_min, cfg.ratio_clip_max, cfg.ratio_clip_c) == (0.2, 0.2, None)
    assert (cfg.reference_policy_kl_penalty, cfg.reference_policy_kl_type) == (0.01, "k3")
    assert (cfg.kl_input_clamp_value, cfg.kl_output_clamp_value) == (20.0, 10.0)
    assert cfg.token_level_loss and not cfg.use_importance_sampling_correction
    # The config's loss_fn section is built from the kernels' option objects: same keys, same defaults.
    assert cfg.model_dump() == {**ClippedPGOptions().as_dict(), **dataclasses.asdict(DistillationLossOptions())}
    assert cfg.options() == ClippedPGOptions()
    assert cfg.distillation_options() == DistillationLossOptions()  # NeMo RL's: mixed, 0.5, not zero_outside_topk
    assert (DistillationLossOptions().kl_type, DistillationLossOptions().mixed_kl_weight) == ("mixed", 0.5)
    assert kwonly_defaults(clipped_pg_loss)["options"] == ClippedPGOptions()


def test_other_configs_feed_their_kernels():
    assert set(RewardShapingConfig().model_dump()) == set(kwonly_defaults(apply_reward_shaping))
    assert set(RewardScalingConfig().model_dump()) == set(kwonly_defaults(scale_rewards))
    gae_keys = set(PPOAdvEstimatorConfig().gae_kwargs())
    assert gae_keys <= set(kwonly_defaults(compute_gae))
    assert PPOAdvEstimatorConfig().gae_kwargs() == {k: v for k,
                                                    v in kwonly_defaults(compute_gae).items() if k in gae_keys}
    assert GRPOAdvEstimatorConfig().model_dump() == dict(
        name="grpo", normalize_rewards=True, use_leave_one_out_baseline=True, reward_weights=None, minus_baseline=True
    )


def error_lines(model, **kw):
    with pytest.raises(ValidationError) as exc:
        model(**kw)
    return str(exc.value)


@pytest.mark.parametrize(
    "kw, expected",
    [
        (dict(ratio_clip_c=0.5), "ratio_clip_c = 0.5: dual-clip needs c > 1 (3 is usual); set it above 1 or to null"),
        (dict(use_cispo=True, ratio_clip_c=3.0), "use_cispo = true with ratio_clip_c = 3.0"),
        (dict(use_cispo=True, token_level_loss=False), "use_cispo = true with token_level_loss = false"),
        (dict(use_cispo=True, disable_ppo_ratio=True), "use_cispo = true with disable_ppo_ratio = true"),
        (dict(truncated_importance_sampling_type="tis", truncated_importance_sampling_ratio=2.0),
         "with use_importance_sampling_correction = false"),
        (dict(use_importance_sampling_correction=True, truncated_importance_sampling_type="tis"),
         "truncated_importance_sampling_ratio = null"),
        (dict(use_importance_sampling_correction=True, truncated_importance_sampling_type="icepop",
              truncated_importance_sampling_ratio=5.0), "needs a lower bound"),
        (dict(use_importance_sampling_correction=True, truncated_importance_sampling_type="tis",
              truncated_importance_sampling_ratio=1.0, truncated_importance_sampling_ratio_min=2.0), "must not exceed"),
        (dict(sequence_level_importance_ratios=True), "GSPO needs a sequence-level loss"),
        (dict(truncated_importance_sampling_ratio=2.0), "with no type"),
        (dict(reference_policy_kl_type="k4"), "reference_policy_kl_type"),
        (dict(loss_fn_typo=1), "Extra inputs are not permitted"),
    ],
)
def test_loss_config_rejects_invalid_combinations(kw, expected):
    assert expected in error_lines(LossConfig, **kw)


def test_loss_config_reports_all_errors_at_once_and_is_frozen():
    msg = error_lines(LossConfig, ratio_clip_c=0.5, use_cispo=True, token_level_loss=False)
    assert "ratio_clip_c = 0.5" in msg and "token_level_loss = false" in msg
    cfg = LossConfig()
    with pytest.raises(ValidationError):
        cfg.ratio_clip_min = 0.3  # type: ignore[misc]


def test_valid_advanced_loss_configs():
    LossConfig(use_importance_sampling_correction=True, truncated_importance_sampling_type="icepop",
               truncated_importance_sampling_ratio=5.0, truncated_importance_sampling_ratio_min=0.5)
    LossConfig(token_level_loss=False, sequence_level_importance_ratios=True)
    LossConfig(use_cispo=True, ratio_clip_max=5.0)
    LossConfig(ratio_clip_max=0.28, ratio_clip_c=10.0, reference_policy_kl_penalty=0.0)


def test_reward_shaping_scaling_and_estimator_rules():
    assert "max_response_length" in error_lines(RewardShapingConfig, enabled=True)
    RewardShapingConfig(enabled=True, max_response_length=512)
    RewardShapingConfig(enabled=True, stop_properly_penalty_coef=0.0)
    assert "stop_properly_penalty_coef = 1.5" in error_lines(RewardShapingConfig, stop_properly_penalty_coef=1.5)
    assert "overlong_buffer_length = 600 > max_response_length = 512" in error_lines(
        RewardShapingConfig, enabled=True, max_response_length=512, overlong_buffer_length=600)
    assert "source_max = 0.0 <= source_min = 0.0" in error_lines(RewardScalingConfig, source_max=0.0)
    assert "gae_lambda = 1.5" in error_lines(PPOAdvEstimatorConfig, gae_lambda=1.5)
    assert "length_adaptive_alpha = -1.0" in error_lines(PPOAdvEstimatorConfig, length_adaptive_alpha=-1.0)
    assert "reward_weights" in error_lines(GRPOAdvEstimatorConfig, reward_weights=[1.0, 2.0])
    GRPOAdvEstimatorConfig(name="gdpo", reward_weights=[1.0, 2.0])
    assert "name" in error_lines(PPOAdvEstimatorConfig, name="grpo")


def test_distillation_loss_options_are_checked_in_one_line_each():
    with pytest.raises(ValidationError) as e:
        LossConfig(mixed_kl_weight=1.5, kl_type="sampled_reverse", zero_outside_topk=True)
    text = str(e.value)
    assert "mixed_kl_weight = 1.5: the forward KL's weight must be in [0, 1]" in text
    assert "zero_outside_topk = true with kl_type = 'sampled_reverse'" in text
