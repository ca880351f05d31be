"""The RL math core: advantages, losses, KL estimators, sample filters, as pure torch functions.

Names are imported from their modules on first use: the config imports ``loss_options`` (plain
dataclasses) to validate ``loss_fn``, and validating a config must not wait for torch.
"""

from __future__ import annotations

import sys
import types

from rlplane.lazy_names import lazy_names

_HOMES = {
    "advantages": ("calculate_baseline_and_std_per_prompt", "clip_advantages", "gdpo_advantages", "group_ids",
                   "grpo_advantages", "opd_advantages", "raw_reward_advantages", "reinforce_plus_plus_advantages",
                   "rloo_advantages"),
    "filters": ("DynamicSamplingSelection", "apply_reward_shaping", "dapo_overlong_penalty",
                "dynamic_sampling_keep_mask", "dynamic_sampling_select", "failed_group_keep_mask",
                "overlong_filter_sample_mask", "scale_rewards", "seq_logprob_error_mask", "seq_mult_prob_error",
                "stop_properly_penalty"),
    "gae": ("compute_gae", "gae_recursion", "gae_token_rewards", "length_adaptive_lambda"),
    "kl": ("kl_estimate", "reward_kl"),
    "loss_options": ("ClippedPGOptions", "KLInReward"),
    "losses": ("CLIPPED_PG_METRIC_REDUCTIONS", "NLL_METRIC_REDUCTIONS", "VALUE_METRIC_REDUCTIONS", "clipped_pg_loss",
               "nll_loss", "reverse_kl_loss"),
    "value_loss": ("explained_variance", "value_loss"),
}

__all__, __getattr__, __dir__ = lazy_names(__name__, _HOMES)
_NAMES = frozenset(__all__)


class _Package(types.ModuleType):
    """The package's module: importing the submodule ``value_loss`` must not replace the function of that name
    (Python binds a submodule to its package's attribute when it is first imported)."""

    def __setattr__(self, name: str, value) -> None:
        if name in _NAMES and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
