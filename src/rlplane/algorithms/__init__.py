"""The RL math core: advantages, losses, KL estimators, sample filters, as pure torch functions."""

from rlplane.algorithms.advantages import (
    calculate_baseline_and_std_per_prompt,
    clip_advantages,
    gdpo_advantages,
    group_ids,
    grpo_advantages,
    opd_advantages,
    raw_reward_advantages,
    reinforce_plus_plus_advantages,
    rloo_advantages,
)
from rlplane.algorithms.filters import (
    DynamicSamplingSelection,
    apply_reward_shaping,
    dapo_overlong_penalty,
    dynamic_sampling_keep_mask,
    dynamic_sampling_select,
    failed_group_keep_mask,
    overlong_filter_sample_mask,
    scale_rewards,
    seq_logprob_error_mask,
    seq_mult_prob_error,
    stop_properly_penalty,
)
from rlplane.algorithms.gae import compute_gae, gae_recursion, gae_token_rewards, length_adaptive_lambda
from rlplane.algorithms.kl import kl_estimate, reward_kl
from rlplane.algorithms.loss_options import ClippedPGOptions, KLInReward
from rlplane.algorithms.losses import (
    CLIPPED_PG_METRIC_REDUCTIONS,
    NLL_METRIC_REDUCTIONS,
    VALUE_METRIC_REDUCTIONS,
    clipped_pg_loss,
    nll_loss,
    reverse_kl_loss,
)
from rlplane.algorithms.value_loss import explained_variance, value_loss

__all__ = [
    "CLIPPED_PG_METRIC_REDUCTIONS",
    "NLL_METRIC_REDUCTIONS",
    "VALUE_METRIC_REDUCTIONS",
    "DynamicSamplingSelection",
    "apply_reward_shaping",
    "calculate_baseline_and_std_per_prompt",
    "clip_advantages",
    "clipped_pg_loss",
    "compute_gae",
    "dapo_overlong_penalty",
    "dynamic_sampling_keep_mask",
    "dynamic_sampling_select",
    "explained_variance",
    "failed_group_keep_mask",
    "gae_recursion",
    "gae_token_rewards",
    "gdpo_advantages",
    "group_ids",
    "grpo_advantages",
    "kl_estimate",
    "KLInReward",
    "length_adaptive_lambda",
    "ClippedPGOptions",
    "nll_loss",
    "reverse_kl_loss",
    "reward_kl",
    "opd_advantages",
    "overlong_filter_sample_mask",
    "raw_reward_advantages",
    "reinforce_plus_plus_advantages",
    "rloo_advantages",
    "scale_rewards",
    "seq_logprob_error_mask",
    "seq_mult_prob_error",
    "stop_properly_penalty",
    "value_loss",
]
