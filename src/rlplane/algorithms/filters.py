"""Sample filters and reward transforms: DAPO dynamic sampling (arXiv 2503.14476), overlong filtering and
reward shaping, reward scaling, logprob-error masking. B samples, T tokens, L prompt tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from rlplane.algorithms._ops import masked_sum, safe_div
from rlplane.algorithms.advantages import group_ids

# Dynamic sampling (DAPO)


def dynamic_sampling_keep_mask(prompt_ids: Tensor, rewards: Tensor, valid_mask: Tensor | None = None) -> Tensor:
    """(B,) bool: True for the samples of groups whose valid rewards are not all equal (DAPO).

    Groups are kept or dropped whole (max ≠ min, as in the paper; NeMo RL's per-sample leave-one-out
    std would also drop the odd sample of [1, 0, 0, 0]). Pass the unshaped reward. Invalid samples are never kept.
    """
    b = rewards.shape[0]
    if b == 0:
        return torch.zeros(0, dtype=torch.bool, device=rewards.device)
    gid = group_ids(prompt_ids)
    valid = torch.ones(b, dtype=torch.bool, device=rewards.device) if valid_mask is None else valid_mask != 0
    r = rewards.to(torch.float64)
    inf = torch.full((b,), float("inf"), dtype=torch.float64, device=rewards.device)
    gmax = (-inf).scatter_reduce(0, gid, torch.where(valid, r, -inf), reduce="amax")[gid]
    gmin = inf.clone().scatter_reduce(0, gid, torch.where(valid, r, inf), reduce="amin")[gid]
    return valid & (gmax > gmin)


def failed_group_keep_mask(prompt_ids: Tensor, failed: Tensor) -> Tensor:
    """(B,) bool: True for the samples of groups where none failed (``rollout_failure_policy: drop_group``)."""
    if failed.numel() == 0:
        return torch.zeros(0, dtype=torch.bool, device=failed.device)
    gid = group_ids(prompt_ids)
    any_failed = torch.zeros(int(gid.max()) + 1, dtype=torch.bool, device=failed.device)
    any_failed = any_failed.scatter_reduce(0, gid, failed.bool(), reduce="amax")  # (num_groups,)
    return ~any_failed[gid]


class DynamicSamplingSelection(NamedTuple):
    """``indices[i]``: rows to take from generation batch ``i``; together exactly the target size.

    ``num_discarded_valid_samples``: kept samples cut by the final slice; ``num_filled_samples``: dropped samples
    taken to fill the batch (``fill``).
    """

    indices: list[Tensor]
    num_gen_batches: int
    num_discarded_valid_samples: int
    num_filled_samples: int = 0


ALL_EQUAL_GROUPS_HINT = ("too many prompt groups have all-equal rewards; raise dynamic_sampling_max_gen_batches or "
              "grpo.batch_multiplier, or use easier/harder prompts")


def dynamic_sampling_select(
    keep_masks: Sequence[Tensor], target_num_samples: int, dynamic_sampling_max_gen_batches: int,
    why_dropped: str = ALL_EQUAL_GROUPS_HINT, fill: bool = False,
) -> DynamicSamplingSelection | None:
    """Accumulate kept samples across generation batches and slice to the target (control flow, reads counts).

    Returns the first ``target_num_samples`` kept samples in generation order once there are enough,
    None while more batches are needed. After ``dynamic_sampling_max_gen_batches`` batches still short: raises
    ``RuntimeError`` ending with ``why_dropped`` (NeMo RL), or with ``fill`` takes every kept sample and the first
    dropped ones in generation order up to the target (whole groups: groups are contiguous and the target is a
    multiple of the group size; an all-equal group has zero advantage, so it adds no gradient).
    """
    if dynamic_sampling_max_gen_batches <= 0:
        raise ValueError(
            f"grpo.dynamic_sampling_max_gen_batches = {dynamic_sampling_max_gen_batches}: needs a positive "
            "number of generation batches (10 is usual)"
        )
    kept = [torch.nonzero(mask, as_tuple=False).flatten() for mask in keep_masks]
    counts = [int(k.numel()) for k in kept]
    total = sum(counts)
    if total < target_num_samples:
        if len(keep_masks) >= dynamic_sampling_max_gen_batches and fill:
            indices, need = [], target_num_samples - total
            for mask, k in zip(keep_masks, kept):
                extra = torch.nonzero(~mask, as_tuple=False).flatten()[: max(need, 0)]
                need -= int(extra.numel())
                indices.append(torch.sort(torch.cat([k, extra])).values)
            return DynamicSamplingSelection(indices, len(keep_masks), 0, target_num_samples - total - max(need, 0))
        if len(keep_masks) >= dynamic_sampling_max_gen_batches:
            raise RuntimeError(
                f"dynamic sampling kept {total} of the {target_num_samples} samples needed after "
                f"{len(keep_masks)} generation batches (grpo.dynamic_sampling_max_gen_batches = "
                f"{dynamic_sampling_max_gen_batches}): {why_dropped}"
            )
        return None
    indices, need = [], target_num_samples
    for k in kept:
        take = k[: max(need, 0)]
        indices.append(take)
        need -= int(take.numel())
    return DynamicSamplingSelection(indices, len(keep_masks), total - target_num_samples)


# Overlong filtering and reward shaping


def overlong_filter_sample_mask(sample_mask: Tensor, truncated: Tensor) -> Tensor:
    """``sample_mask · (1 − truncated)`` (B,): truncated samples get no loss but still count in the baseline."""
    return sample_mask * (1 - truncated.to(sample_mask.dtype))


def dapo_overlong_penalty(
    rewards: Tensor,
    response_lengths: Tensor,
    *,
    overlong_buffer_length: int,
    overlong_buffer_penalty: float,
    max_response_length: int,
) -> Tensor:
    """DAPO soft overlong punishment, (B,).

    ``r ← r + min(−(L − expected) / overlong_buffer_length · penalty, 0)``, ``expected = max_response_length −
    overlong_buffer_length``: linear down to ``−penalty`` at ``max_response_length``, unclamped beyond.
    """
    expected = max_response_length - overlong_buffer_length
    over = (response_lengths.to(rewards.dtype) - expected) / overlong_buffer_length
    return rewards + torch.clamp(-over * overlong_buffer_penalty, max=0.0)


def stop_properly_penalty(rewards: Tensor, truncated: Tensor, stop_properly_penalty_coef: float) -> Tensor:
    """``r ← r · coef`` for truncated samples (coef in [0, 1]; 0 zeroes their reward). (B,)"""
    return torch.where(truncated.bool(), rewards * stop_properly_penalty_coef, rewards)


def apply_reward_shaping(
    rewards: Tensor,
    response_lengths: Tensor,
    truncated: Tensor,
    *,
    enabled: bool = False,
    overlong_buffer_length: int | None = 128,
    overlong_buffer_penalty: float | None = 1.0,
    max_response_length: int | None = None,
    stop_properly_penalty_coef: float | None = None,
) -> Tensor:
    """``grpo.reward_shaping`` (keywords = config keys): the stop-properly penalty if its coef is set, else DAPO's."""
    if not enabled:
        return rewards
    if stop_properly_penalty_coef is not None:
        return stop_properly_penalty(rewards, truncated, stop_properly_penalty_coef)
    if overlong_buffer_length is None or overlong_buffer_penalty is None or max_response_length is None:
        raise ValueError(
            "reward_shaping.enabled = true needs overlong_buffer_length, overlong_buffer_penalty and "
            f"max_response_length (got {overlong_buffer_length}, {overlong_buffer_penalty}, {max_response_length}); "
            "set them or stop_properly_penalty_coef"
        )
    return dapo_overlong_penalty(
        rewards, response_lengths, overlong_buffer_length=overlong_buffer_length,
        overlong_buffer_penalty=overlong_buffer_penalty, max_response_length=max_response_length,
    )


def scale_rewards(
    rewards: Tensor,
    *,
    enabled: bool = True,
    source_min: float = 0.0,
    source_max: float = 1.0,
    target_min: float = 0.0,
    target_max: float = 1.0,
) -> Tensor:
    """``grpo.reward_scaling``: ``r ← t_min + (clamp(r, s_min, s_max) − s_min)/(s_max − s_min)·(t_max − t_min)``."""
    if not enabled:
        return rewards
    clamped = rewards.clamp(source_min, source_max)
    return target_min + (clamped - source_min) / (source_max - source_min) * (target_max - target_min)


# Sequence-level logprob-error masking


def seq_mult_prob_error(
    generation_logprobs: Tensor, prev_logprobs: Tensor, token_mask: Tensor, sample_mask: Tensor
) -> Tensor:
    """(B,) ``seq_err_b = Σ_t exp(|gen − prev|·m)·m / Σ_t m``, ``m = token_mask·sample_mask``; ≈ 1 is healthy."""
    dtype = torch.promote_types(prev_logprobs.dtype, torch.float32)
    m = token_mask.to(dtype) * sample_mask.to(dtype)[:, None]
    diff = torch.where(m != 0, (generation_logprobs.to(dtype) - prev_logprobs.to(dtype)).abs(),
                       torch.zeros((), dtype=dtype, device=m.device))
    return safe_div(masked_sum(torch.exp(diff * m), m, dim=-1), m.sum(dim=-1))


def seq_logprob_error_mask(
    generation_logprobs: Tensor,
    prev_logprobs: Tensor,
    token_mask: Tensor,
    sample_mask: Tensor,
    seq_logprob_error_threshold: float | None,
    rewards: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """``sample_mask_b ← sample_mask_b · [seq_err_b ≤ threshold]``; returns ``(new_sample_mask (B,), metrics)``.

    Metrics are over sequences with ``sample_mask ≠ 0`` and a valid token (0 when none):
    ``max/mean/min_seq_mult_prob_error`` before and ``_after_mask``, ``num_masked_seqs_by_logprob_error``,
    ``masked_correct_pct`` (masked sequences with reward == 1).
    """
    err = seq_mult_prob_error(generation_logprobs, prev_logprobs, token_mask, sample_mask)  # (B,)
    # (B,) sample_mask ≠ 0 and at least one valid token
    alive = (token_mask.to(err.dtype) * sample_mask.to(err.dtype)[:, None]).sum(dim=-1) > 0
    new_mask = (sample_mask if seq_logprob_error_threshold is None
                else sample_mask * (err <= seq_logprob_error_threshold).to(sample_mask.dtype))
    metrics: dict[str, Tensor] = {}

    def stats(sel: Tensor, suffix: str) -> None:
        zero = torch.zeros((), dtype=err.dtype, device=err.device)
        any_sel = sel.any()
        big = torch.finfo(err.dtype).max
        metrics[f"max_seq_mult_prob_error{suffix}"] = torch.where(
            any_sel, torch.where(sel, err, -big).amax() if err.numel() else zero, zero)
        metrics[f"min_seq_mult_prob_error{suffix}"] = torch.where(
            any_sel, torch.where(sel, err, big).amin() if err.numel() else zero, zero)
        metrics[f"mean_seq_mult_prob_error{suffix}"] = safe_div(masked_sum(err, sel.to(err.dtype)),
                                                                sel.sum().to(err.dtype))

    stats(alive, "")
    stats((new_mask != 0) & alive, "_after_mask")
    masked = alive & (new_mask == 0)
    metrics["num_masked_seqs_by_logprob_error"] = masked.sum()
    if rewards is not None:
        metrics["masked_correct_pct"] = safe_div((masked & (rewards == 1)).sum().to(err.dtype),
                                                 masked.sum().to(err.dtype))
    return new_mask, metrics
