"""Per-token KL estimators (Schulman 2020, "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html).

Samples come from the policy whose logprobs are ``logprobs``; ``log r = logprobs_reference − logprobs``.

- ``k1 = −log r``                 (unbiased, high variance, can be negative)
- ``k2 = (log r)² / 2``           (biased, low variance)
- ``k3 = exp(log r) − 1 − log r`` (unbiased, low variance, always ≥ 0; the default)
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from rlplane.algorithms.loss_options import KL_TYPES, KLInReward  # noqa: F401 (KL_TYPES: re-exported)

KLType = Literal["k1", "k2", "k3"]


def kl_estimate(
    logprobs: Tensor,
    logprobs_reference: Tensor,
    kl_type: str = "k3",
    input_clamp_value: float | None = None,
    output_clamp_value: float | None = None,
    importance_weights: Tensor | None = None,
) -> Tensor:
    """Elementwise estimate of ``KL(P ‖ P_ref)`` from samples of P (inputs broadcastable).

    ``log r = clamp(ref − logprobs, ±input_clamp_value)``, ``k = k1|k2|k3(log r)``, then
    ``clamp(importance_weights·k, ±output_clamp_value)``. Inside an active input clamp the weight is
    detached too, so no gradient leaks through the constant ``k`` (as NeMo RL's ``calculate_kl``).
    """
    log_ratio = logprobs_reference - logprobs
    if input_clamp_value is not None:
        clamped = log_ratio.clamp(-input_clamp_value, input_clamp_value)
        if importance_weights is not None:
            importance_weights = torch.where(clamped == log_ratio, importance_weights, importance_weights.detach())
        log_ratio = clamped
    if kl_type == "k1":
        kl = -log_ratio
    elif kl_type == "k2":
        kl = 0.5 * log_ratio.square()
    elif kl_type == "k3":
        kl = torch.expm1(log_ratio) - log_ratio
    else:
        raise ValueError(f"kl_type = {kl_type!r}: unknown KL estimator; use one of {', '.join(KL_TYPES)}")
    if importance_weights is not None:
        kl = importance_weights * kl
    if output_clamp_value is not None:
        kl = kl.clamp(-output_clamp_value, output_clamp_value)
    return kl


def reward_kl(kl_in_reward: KLInReward, prev_logprobs: Tensor | None, reference_logprobs: Tensor | None,
              mask: Tensor) -> Tensor:
    """(B, T) ``KL_t(prev ‖ ref)`` where ``mask ≠ 0`` (0 elsewhere), the term REINFORCE++ and GAE scale by β."""
    if prev_logprobs is None or reference_logprobs is None:
        raise ValueError("kl_in_reward needs prev_logprobs and reference_logprobs (loss_fn.use_kl_in_reward)")
    k = kl_in_reward
    kl = kl_estimate(prev_logprobs, reference_logprobs, k.kl_type, k.input_clamp_value, k.output_clamp_value)
    return torch.where(mask != 0, kl, torch.zeros_like(kl))
