"""Token-level GAE (Schulman et al. 2016, arXiv 1506.02438) with VAPO's decoupled and length-adaptive λ
(Yue et al. 2025, arXiv 2504.05118). B sequences, T tokens.
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
    """(B, T) token rewards: ``−β·KL_t(prev ‖ ref)`` (``kl_in_reward``) plus the (B,) reward on the last masked one."""
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
    """Backward GAE recursion (B, T); masked positions carry the next valid token's accumulators through.

    For t = T−1 … 0: ``δ = r_t + γ·next_v − V_t``, ``g = δ + γ·λ·gae``, ``next_v ← m_t·V_t + (1−m_t)·next_v``,
    ``gae ← m_t·g + (1−m_t)·gae``, ``A_t = gae``. ``lam``: float or (B,).
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
    """Token-level GAE for PPO (keywords = ``ppo.adv_estimator.*``); returns ``(advantages, returns)`` (B, T).

    ``λ_value = gae_lambda_value or gae_lambda``; ``λ_policy`` = length-adaptive if α > 0, else
    ``gae_lambda_policy or gae_lambda``; returns ``R = A(λ_value) + V``, advantages ``A(λ_policy)``,
    optionally whitened over the mask: ``(A − μ)·rsqrt(var + 1e-8)``, unbiased var. ``values`` (B, T) hold
    ``V(s_t)`` (right-shifted); ``mask = token_mask·sample_mask``; advantages are 0 outside it.
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
