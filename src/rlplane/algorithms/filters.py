"""Sample filters and reward transforms: DAPO dynamic sampling, overlong filtering and reward
shaping, reward scaling, sequence-level logprob-error masking.

Pure functions over tensors returning masks, index tensors or new rewards; the trainer applies
them to the data-plane metadata. Shape legend: B = samples, T = tokens, L = prompt tokens.
DAPO: Yu et al. 2025, https://arxiv.org/abs/2503.14476.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from rlplane.algorithms._ops import masked_sum, safe_div
from rlplane.algorithms.advantages import group_ids

# --------------------------------------------------------------------------------------------
# Dynamic sampling (DAPO)
# --------------------------------------------------------------------------------------------


def dynamic_sampling_keep_mask(prompt_ids: Tensor, rewards: Tensor, valid_mask: Tensor | None = None) -> Tensor:
    """(B,) bool: True for every sample of a prompt group whose valid rewards are not all equal.

    A group where every answer scores the same has reward std 0, hence zero advantage and no
    learning signal; DAPO drops it. The test is on the whole group (max ≠ min over its valid
    samples), so groups are kept or dropped as units. (NeMo RL tests the per-sample
    leave-one-out std, which for n ≥ 3 also drops the single differing sample of a group such as
    [1, 0, 0, 0]; the group test follows the DAPO paper.) Pass the *unshaped* reward when reward
    shaping is on, as NeMo RL does.

    Args:
        prompt_ids: (B,) or (B, L); identical rows form a group.
        rewards: (B,).
        valid_mask: (B,) or None; invalid samples are ignored in the test (and never kept).
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
    """(B,) bool: True for the samples of groups in which no sample failed (``rollout_failure_policy:
    drop_group``; a group is kept or dropped whole, its advantages need every member).

    prompt_ids (B,) or (B, L), identical rows form a group; failed (B,) bool.
    """
    if failed.numel() == 0:
        return torch.zeros(0, dtype=torch.bool, device=failed.device)
    gid = group_ids(prompt_ids)
    any_failed = torch.zeros(int(gid.max()) + 1, dtype=torch.bool, device=failed.device)
    any_failed = any_failed.scatter_reduce(0, gid, failed.bool(), reduce="amax")  # (num_groups,)
    return ~any_failed[gid]


class DynamicSamplingSelection(NamedTuple):
    """What to train on after dynamic sampling.

    ``indices[i]`` are the row indices to take from generation batch ``i`` (in order; their
    concatenation has exactly the target size). ``num_discarded_valid_samples`` counts kept
    (std ≠ 0) samples dropped by the final slice (metric ``dynamic_sampling_num_discarded_valid_samples``).
    """

    indices: list[Tensor]
    num_gen_batches: int
    num_discarded_valid_samples: int


ALL_EQUAL_GROUPS_HINT = ("too many prompt groups have all-equal rewards; raise dynamic_sampling_max_gen_batches or "
              "grpo.batch_multiplier, or use easier/harder prompts")


def dynamic_sampling_select(
    keep_masks: Sequence[Tensor], target_num_samples: int, dynamic_sampling_max_gen_batches: int,
    why_dropped: str = ALL_EQUAL_GROUPS_HINT,
) -> DynamicSamplingSelection | None:
    """Accumulate kept samples across generation batches and slice to the target.

    Call after each generation batch with the keep masks of all batches so far (from
    :func:`dynamic_sampling_keep_mask`). Returns the selection once at least
    ``target_num_samples`` (= ``num_prompts_per_step · num_generations_per_prompt``) samples are
    kept, ``None`` while more batches are needed, and raises ``RuntimeError`` when
    ``dynamic_sampling_max_gen_batches`` batches did not suffice. The first ``target`` kept samples
    are taken in generation order, so whole groups survive when groups are contiguous and the
    target is a multiple of the group size. This is control flow: it reads counts on the host.
    ``why_dropped`` ends the error message: why samples are not kept and what to do.
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


# --------------------------------------------------------------------------------------------
# Overlong filtering and reward shaping
# --------------------------------------------------------------------------------------------


def overlong_filter_sample_mask(sample_mask: Tensor, truncated: Tensor) -> Tensor:
    """``sample_mask · (1 − truncated)``: truncated samples get no loss (``grpo.overlong_filtering``).

    They still count towards the reward baseline (apply this after the advantages' baseline).
    Shapes: (B,), (B,) bool/0-1.
    """
    return sample_mask * (1 - truncated.to(sample_mask.dtype))


def dapo_overlong_penalty(
    rewards: Tensor,
    response_lengths: Tensor,
    *,
    overlong_buffer_length: int,
    overlong_buffer_penalty: float,
    max_response_length: int,
) -> Tensor:
    """DAPO soft overlong punishment.

    ``expected = max_response_length − overlong_buffer_length``;
    ``r ← r + min(−(L − expected) / overlong_buffer_length · penalty, 0)``: 0 up to ``expected``
    tokens, then linearly down to ``−penalty`` at ``max_response_length`` (and beyond, unclamped).
    Shapes: rewards (B,), response_lengths (B,) = tokens of the first assistant turn.
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
    """``grpo.reward_shaping``: keyword names equal the config keys (``**cfg.model_dump()``).

    Disabled: rewards unchanged. With ``stop_properly_penalty_coef`` set: :func:`stop_properly_penalty`
    only (the overlong parameters are ignored). Otherwise :func:`dapo_overlong_penalty`, which
    needs all three overlong parameters. Keep the unshaped rewards for dynamic sampling.
    """
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
    """``grpo.reward_scaling``: ``r ← t_min + (clamp(r, s_min, s_max) − s_min)/(s_max − s_min)·(t_max − t_min)``.

    Keyword names equal the config keys. Disabled: rewards unchanged. (B,) or any shape.
    """
    if not enabled:
        return rewards
    clamped = rewards.clamp(source_min, source_max)
    return target_min + (clamped - source_min) / (source_max - source_min) * (target_max - target_min)


# --------------------------------------------------------------------------------------------
# Sequence-level logprob-error masking
# --------------------------------------------------------------------------------------------


def seq_mult_prob_error(
    generation_logprobs: Tensor, prev_logprobs: Tensor, token_mask: Tensor, sample_mask: Tensor
) -> Tensor:
    """Per-sequence multiplicative probability error between the generation and training backends.

    ``seq_err_b = Σ_t exp(|gen − prev|·m)·m / Σ_t m`` with ``m = token_mask·sample_mask``; ≈ 1 is
    healthy. 0 for a sequence with no valid token. Shapes: (B, T), (B, T), (B, T), (B,) → (B,).
    """
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
    """Drop sequences whose generation/training logprob mismatch is too large.

    ``sample_mask_b ← sample_mask_b · [seq_err_b ≤ threshold]`` (unchanged when the threshold is None).

    Metrics (0-d tensors, over sequences with ``sample_mask ≠ 0`` and at least one valid token,
    as NeMo RL: a sequence with no valid token has no error, not an error of 0; all 0 when there
    are none):
    ``max/mean/min_seq_mult_prob_error`` (before masking), the same with ``_after_mask`` (over the
    sequences still kept), ``num_masked_seqs_by_logprob_error``, and ``masked_correct_pct``
    (fraction of the masked sequences with reward == 1; needs ``rewards``).

    Returns ``(new_sample_mask (B,), metrics)``.
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
