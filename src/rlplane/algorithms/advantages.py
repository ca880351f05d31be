"""Reward baselines and advantages of the GRPO family (formulas: ``docs/algorithms.md``).

Shapes: B samples, T tokens, L prompt tokens, K reward components. GRPO (arXiv 2402.03300):
``A = (r − b) / (std + 1e-6)`` where std > 0; RLOO (arXiv 2402.14740): ``A = r − b_loo``;
REINFORCE++ (arXiv 2501.03262); GDPO; raw reward; OPD. GAE is in :mod:`rlplane.algorithms.gae`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from rlplane.algorithms._ops import masked_whiten, safe_div
from rlplane.algorithms.kl import reward_kl
from rlplane.algorithms.loss_options import KLInReward

GRPO_STD_EPS = 1e-6
REINFORCE_PP_VAR_FLOOR = 1e-8
RAW_REWARD_VAR_FLOOR = 1e-8


def group_ids(prompt_ids: Tensor) -> Tensor:
    """Dense group index (B,) int64 of each row of ``prompt_ids`` (B,) or (B, L); identical rows share one."""
    if prompt_ids.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long, device=prompt_ids.device)
    _, inverse = torch.unique(prompt_ids, dim=0, return_inverse=True)
    return inverse


def calculate_baseline_and_std_per_prompt(
    prompt_ids: Tensor,
    rewards: Tensor,
    valid_mask: Tensor | None = None,
    leave_one_out: bool = True,
) -> tuple[Tensor, Tensor]:
    """Per-sample reward baseline and std over the sample's prompt group (identical ``prompt_ids`` rows).

    With valid mask v, ``n_v = Σ v`` and ``k = n_v − v_i`` under leave-one-out (else ``k = n_v``):
    ``b_i = (Σ_j v_j r_j − [loo]·v_i r_i) / k`` and ``std_i`` the unbiased std of those k samples
    (0 when ``k ≤ 1``). Groups with ``n_v ≤ 1`` get ``b_i = r_i``, ``std_i = 0``; an invalid sample gets
    its group's valid mean and std. When the k samples are exactly equal, std is exactly 0 (a 1e-9
    residue would pass ``std > 0`` and scale the advantage by 1e6); otherwise the variance is taken on
    group-centred float64 rewards. Returns ``(baseline, std)``, both (B,) in the dtype of ``rewards``.
    """
    if rewards.shape[0] == 0:
        return rewards.clone(), torch.zeros_like(rewards)
    gid = group_ids(prompt_ids)  # (B,)
    num_groups = rewards.shape[0]  # an upper bound on the group count: no device sync needed
    r = rewards.to(torch.float64)
    v = torch.ones_like(r) if valid_mask is None else valid_mask.to(torch.float64)
    r = torch.where(v != 0, r, torch.zeros_like(r))  # invalid rewards may be NaN; keep them out

    def group_sum(x: Tensor) -> Tensor:  # (B,) -> (B,) sum over the sample's group
        return torch.zeros(num_groups, dtype=x.dtype, device=x.device).index_add_(0, gid, x)[gid]

    n_valid = group_sum(v)  # (B,)
    sum_r = group_sum(v * r)  # (B,)
    loo = 1.0 if leave_one_out else 0.0
    k = n_valid - loo * v  # number of samples in sample i's baseline (an invalid i is not among them)
    baseline = safe_div(sum_r - loo * v * r, k)

    # Variance of the k samples, on group-centred rewards (shift-invariant).
    centred = r - safe_div(sum_r, n_valid)
    sum_c, sum_c2 = group_sum(v * centred), group_sum(v * centred.square())
    mean_c = safe_div(sum_c - loo * v * centred, k)
    sq_c = safe_div(sum_c2 - loo * v * centred.square(), k)
    var_biased = torch.clamp(sq_c - mean_c.square(), min=0.0)
    std = torch.sqrt(safe_div(var_biased * k, k - 1.0))
    std = torch.where(k > 1, std, torch.zeros_like(std))

    # The others all equal: std exactly 0, baseline their common value.
    others_max, others_min = _others_extrema(gid, r, v != 0, leave_one_out, num_groups)
    equal = others_max == others_min  # (B,); False when there are no others (±inf)
    baseline = torch.where(equal, others_max, baseline)
    std = torch.where(equal, torch.zeros_like(std), std)

    small = n_valid <= 1
    baseline = torch.where(small, rewards.to(torch.float64), baseline)
    std = torch.where(small, torch.zeros_like(std), std)
    return baseline.to(rewards.dtype), std.to(rewards.dtype)


def _others_extrema(gid: Tensor, r: Tensor, valid: Tensor, leave_one_out: bool,
                    num_groups: int) -> tuple[Tensor, Tensor]:
    """(max, min) (B,) float64 of the valid rewards of i's group, i left out under leave-one-out (±inf if none)."""
    def extremum(x: Tensor, reduce: str, fill: float) -> Tensor:  # (B,) -> (B,) per-group max/min
        out = torch.full((num_groups,), fill, dtype=x.dtype, device=x.device)
        return out.scatter_reduce(0, gid, x, reduce=reduce)[gid]

    result = []
    for reduce, fill in (("amax", -math.inf), ("amin", math.inf)):
        top = extremum(torch.where(valid, r, torch.full_like(r, fill)), reduce, fill)  # (B,)
        if leave_one_out:
            at_top = valid & (r == top)
            count = torch.zeros(num_groups, dtype=torch.long, device=r.device).index_add_(0, gid, at_top.long())[gid]
            second = extremum(torch.where(valid & ~at_top, r, torch.full_like(r, fill)), reduce, fill)
            top = torch.where(at_top & (count == 1), second, top)
        result.append(top)
    return result[0], result[1]


def normalize_by_std(advantages: Tensor, std: Tensor, epsilon: float = GRPO_STD_EPS) -> Tensor:
    """``A / (std + ε)`` where ``std > 0``; ``A`` unchanged where ``std == 0`` (all-equal groups)."""
    return torch.where(std > 0, advantages / (std + epsilon), advantages)


def grpo_advantages(
    prompt_ids: Tensor,
    rewards: Tensor,
    valid_mask: Tensor | None = None,
    *,
    normalize_rewards: bool = True,
    use_leave_one_out_baseline: bool = True,
    minus_baseline: bool = True,
    epsilon: float = GRPO_STD_EPS,
) -> Tensor:
    """GRPO per-sample advantage (B,): ``A_i = r_i − b_i``, divided by ``std_i + ε`` where ``std_i > 0``.

    No baseline without ``minus_baseline``; no division without ``normalize_rewards``.
    """
    baseline, std = calculate_baseline_and_std_per_prompt(prompt_ids, rewards, valid_mask, use_leave_one_out_baseline)
    adv = rewards - baseline if minus_baseline else rewards.clone()
    if normalize_rewards:
        adv = normalize_by_std(adv, std, epsilon)
    return adv


def rloo_advantages(prompt_ids: Tensor, rewards: Tensor, valid_mask: Tensor | None = None) -> Tensor:
    """RLOO per-sample advantage (B,): ``A_i = r_i − mean_{j≠i} r_j`` (use with ``disable_ppo_ratio``)."""
    return grpo_advantages(prompt_ids, rewards, valid_mask, normalize_rewards=False, use_leave_one_out_baseline=True)


def reinforce_plus_plus_advantages(
    prompt_ids: Tensor,
    rewards: Tensor,
    token_mask: Tensor,
    valid_mask: Tensor | None = None,
    *,
    minus_baseline: bool = True,
    kl_in_reward: KLInReward | None = None,
    prev_logprobs: Tensor | None = None,
    reference_logprobs: Tensor | None = None,
) -> Tensor:
    """REINFORCE++-baseline per-token advantage (B, T), 0 outside ``token_mask``.

    ``A_i = r_i − mean_group(r)`` (or ``r_i``) on every token; with ``kl_in_reward`` ``A_t −= β·KL_t(prev ‖ ref)``
    (:func:`~rlplane.algorithms.kl.reward_kl`); then ``(A − μ)·rsqrt(max(var, 1e-8))`` over the masked tokens.
    """
    if minus_baseline:
        baseline, _ = calculate_baseline_and_std_per_prompt(prompt_ids, rewards, valid_mask, leave_one_out=False)
        adv = rewards - baseline
    else:
        adv = rewards.clone()
    adv = adv[:, None].expand(token_mask.shape).to(torch.promote_types(rewards.dtype, torch.float32))  # (B, T)
    if kl_in_reward is not None:
        adv = adv - kl_in_reward.beta * reward_kl(kl_in_reward, prev_logprobs, reference_logprobs, token_mask)
    return masked_whiten(adv, token_mask, unbiased=False, eps=REINFORCE_PP_VAR_FLOOR, clamp_var=True)


def gdpo_advantages(
    prompt_ids: Tensor,
    reward_components: Mapping[str, Tensor],
    valid_mask: Tensor | None = None,
    *,
    reward_weights: Sequence[float] | None = None,
    normalize_rewards: bool = True,
    use_leave_one_out_baseline: bool = True,
    epsilon: float = GRPO_STD_EPS,
) -> Tensor:
    """GDPO per-sample advantage (B,): each reward component normalised on its own.

    In alphabetical order of names: ``A_k = (r_k − b_k) / (std_k + ε)`` (GRPO, std > 0 only),
    ``A = Σ_k w_k A_k``, then ``A ← (A − mean(A)) / std(A)`` over valid samples where ``std(A) > 0``.
    """
    names = sorted(reward_components)
    if len(names) < 2:
        raise ValueError(f"gdpo needs at least 2 reward components (reward/<name>), got {names}; use name: grpo")
    if reward_weights is not None and len(reward_weights) != len(names):
        raise ValueError(
            f"reward_weights has {len(reward_weights)} entries for {len(names)} components {names}; "
            "give one weight per component in alphabetical order"
        )
    weights = [1.0] * len(names) if reward_weights is None else list(reward_weights)
    total = None
    for w, name in zip(weights, names):
        a = grpo_advantages(
            prompt_ids, reward_components[name], valid_mask, normalize_rewards=normalize_rewards,
            use_leave_one_out_baseline=use_leave_one_out_baseline, epsilon=epsilon,
        )
        total = w * a if total is None else total + w * a
    assert total is not None
    v = torch.ones_like(total) if valid_mask is None else valid_mask.to(total.dtype)
    n = v.sum()
    mean = safe_div((total * v).sum(), n)
    std = torch.sqrt(safe_div(((total - mean).square() * v).sum(), n - 1.0))
    return torch.where(std > 0, (total - mean) / torch.where(std > 0, std, torch.ones_like(std)), total - mean)


def raw_reward_advantages(rewards: Tensor, token_mask: Tensor, *, normalize_advantages: bool = True) -> Tensor:
    """PPO ``raw_reward`` advantage (B, T): ``A_t = r``, optionally whitened (biased var, ``max(var, 1e-8)``)."""
    adv = rewards[:, None].expand(token_mask.shape).to(torch.promote_types(rewards.dtype, torch.float32))
    if normalize_advantages:
        return masked_whiten(adv, token_mask, unbiased=False, eps=RAW_REWARD_VAR_FLOOR, clamp_var=True)
    return torch.where(token_mask != 0, adv, torch.zeros_like(adv))


def opd_advantages(teacher_logprobs: Tensor, prev_logprobs: Tensor, token_mask: Tensor) -> Tensor:
    """On-policy distillation advantage (B, T): ``A_t = (log π_teacher − log π_prev)·mask``, detached."""
    diff = (teacher_logprobs - prev_logprobs).detach()
    return torch.where(token_mask != 0, diff * token_mask, torch.zeros_like(diff))


def clip_advantages(advantages: Tensor, low: float | None = None, high: float | None = None) -> Tensor:
    """``clamp(A, low, high)`` after normalisation; None leaves that side unbounded."""
    if low is None and high is None:
        return advantages
    return advantages.clamp(min=low, max=high)
