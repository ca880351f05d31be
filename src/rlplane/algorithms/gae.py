"""Generalized Advantage Estimation over tokens (Schulman et al. 2016, https://arxiv.org/abs/1506.02438),
with VAPO's decoupled and length-adaptive λ (Yue et al. 2025, https://arxiv.org/abs/2504.05118).

Shape legend: B = batch of sequences, T = tokens per sequence.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlplane.algorithms._ops import masked_whiten
from rlplane.algorithms.kl import reward_kl
from rlplane.algorithms.loss_options import KLInReward

GAE_WHITEN_EPS = 1e-8


def last_valid_index(mask: Tensor) -> Tensor:
    """(B, T) mask → (B,) index of the last position with mask != 0 (0 for an empty row)."""
    b, t = mask.shape
    if t == 0:
        return torch.zeros(b, dtype=torch.long, device=mask.device)
    positions = torch.arange(t, device=mask.device).expand(b, t)
    return torch.where(mask != 0, positions, torch.zeros_like(positions)).amax(dim=-1)


def gae_token_rewards(
    rewards: Tensor,
    mask: Tensor,
    *,
    kl_in_reward: KLInReward | None = None,
    prev_logprobs: Tensor | None = None,
    reference_logprobs: Tensor | None = None,
) -> Tensor:
    """Per-token rewards for GAE: ``r_t = −β·KL_t(prev ‖ ref)`` (only with ``kl_in_reward``: β, estimator, clamps),
    plus the scalar reward on the last position where ``mask = 1``; then ``r_t ← r_t·mask_t``.

    ``rewards``: (B,); ``mask``: (B, T). Returns (B, T) float.
    """
    dtype = torch.promote_types(rewards.dtype, torch.float32)
    token_rewards = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    if kl_in_reward is not None:
        kl = reward_kl(kl_in_reward, prev_logprobs, reference_logprobs, mask)  # (B, T)
        token_rewards = token_rewards - kl_in_reward.beta * kl.to(dtype)
    if mask.shape[-1] > 0:
        last = last_valid_index(mask)  # (B,)
        has_any = (mask != 0).any(dim=-1)
        bonus = torch.where(has_any, rewards.to(dtype), torch.zeros_like(rewards, dtype=dtype))
        token_rewards = token_rewards.scatter_add(1, last[:, None], bonus[:, None])
    return torch.where(mask != 0, token_rewards * mask, torch.zeros_like(token_rewards))


def gae_recursion(token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float | Tensor) -> Tensor:
    """The backward GAE recursion with carry-forward masking. Returns advantages (B, T).

    ``next_v = 0, gae = 0``; for t = T−1 … 0:
    ``δ = r_t + γ·next_v − V_t``, ``g = δ + γ·λ·gae``,
    ``next_v ← m_t·V_t + (1−m_t)·next_v``, ``gae ← m_t·g + (1−m_t)·gae``, ``A_t = gae``.
    At masked positions (prompt, padding, environment tokens) the accumulators of the next valid
    token are carried through unchanged, so they are skipped. ``lam`` is a float or (B,) per sample.
    """
    b, t = values.shape
    m = (mask != 0).to(values.dtype)
    lam_t = torch.as_tensor(lam, dtype=values.dtype, device=values.device)
    next_v = values.new_zeros(b)
    gae = values.new_zeros(b)
    out = torch.zeros_like(values)
    for i in range(t - 1, -1, -1):  # T is small next to the batch work; the loop is over time only
        m_t = m[:, i]
        delta = token_rewards[:, i] + gamma * next_v - values[:, i]
        g = delta + gamma * lam_t * gae
        next_v = m_t * values[:, i] + (1 - m_t) * next_v
        gae = m_t * g + (1 - m_t) * gae
        out[:, i] = gae
    return out


def length_adaptive_lambda(mask: Tensor, alpha: float) -> Tensor:
    """VAPO length-adaptive λ per sample: ``clamp(1 − 1/clamp(α·L, min=1), 0, 1)``, L = Σ_t mask. (B,)"""
    length = (mask != 0).sum(dim=-1).to(torch.float32)
    return torch.clamp(1.0 - 1.0 / torch.clamp(alpha * length, min=1.0), 0.0, 1.0)


def compute_gae(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    *,
    gae_gamma: float = 1.0,
    gae_lambda: float = 0.95,
    gae_lambda_value: float | None = None,
    gae_lambda_policy: float | None = None,
    length_adaptive_alpha: float = 0.0,
    normalize_advantages: bool = True,
    kl_in_reward: KLInReward | None = None,
    prev_logprobs: Tensor | None = None,
    reference_logprobs: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Token-level GAE for PPO. Keyword names equal ``ppo.adv_estimator.*`` keys.

    - token rewards: :func:`gae_token_rewards` (scalar reward on the last valid token, optional
      ``−β·KL`` per token with ``kl_in_reward``, from ``prev_logprobs`` and ``reference_logprobs``);
    - ``λ_value = gae_lambda_value or gae_lambda``; ``λ_policy`` = length-adaptive λ if
      ``length_adaptive_alpha > 0``, else ``gae_lambda_policy or gae_lambda``. When any of the
      three is set the recursion runs twice: returns ``R = A(λ_value) + V``, advantages ``A(λ_policy)``;
    - if ``normalize_advantages``: whiten over the mask, ``(A − μ)·rsqrt(var + 1e-8)`` with the
      unbiased masked variance.

    Args:
        rewards: (B,) scalar sequence rewards.
        values: (B, T) ``V(s_t)`` aligned with the tokens (already right-shifted).
        mask: (B, T) ``token_mask · sample_mask`` (response tokens that are trained on).
    Returns:
        ``(advantages, returns)``, both (B, T). Advantages are 0 outside the mask; returns are
        ``A(λ_value) + V`` everywhere (only meaningful inside the mask).
    """
    values = values.to(torch.promote_types(values.dtype, torch.float32))
    values = torch.where(mask != 0, values, torch.zeros_like(values))  # padding values may be garbage/NaN
    token_rewards = gae_token_rewards(
        rewards, mask, kl_in_reward=kl_in_reward, prev_logprobs=prev_logprobs, reference_logprobs=reference_logprobs,
    ).to(values.dtype)
    decoupled = gae_lambda_value is not None or gae_lambda_policy is not None or length_adaptive_alpha > 0
    lam_value = gae_lambda if gae_lambda_value is None else gae_lambda_value
    adv_value = gae_recursion(token_rewards, values, mask, gae_gamma, lam_value)
    returns = adv_value + values
    if decoupled:
        if length_adaptive_alpha > 0:
            lam_policy: float | Tensor = length_adaptive_lambda(mask, length_adaptive_alpha).to(values.dtype)
        else:
            lam_policy = gae_lambda if gae_lambda_policy is None else gae_lambda_policy
        advantages = gae_recursion(token_rewards, values, mask, gae_gamma, lam_policy)
    else:
        advantages = adv_value
    if normalize_advantages:
        advantages = masked_whiten(advantages, mask, unbiased=True, eps=GAE_WHITEN_EPS)
    else:
        advantages = torch.where(mask != 0, advantages, torch.zeros_like(advantages))
    return advantages, returns
