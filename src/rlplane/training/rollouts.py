"""Building blocks of an on-policy step (GRPO, PPO, distillation), each called from the recipe's
step in the order things happen: rollouts with reward transforms and dynamic sampling, the sample
mask stamped on the receipt, the optional sequence logprob-error filter, and the rollout metrics.
Each reads its knobs from ``cfg.loop`` (the recipe's loop section).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rlplane.algorithms.filters import (
    apply_reward_shaping,
    dynamic_sampling_keep_mask,
    scale_rewards,
    seq_logprob_error_mask,
)
from rlplane.config.schema import RunConfig
from rlplane.dataplane import KVBatchMeta
from rlplane.dataplane.columns import GENERATION_LOGPROBS, PREV_LOGPROBS, TOKEN_MASK
from rlplane.training.loop import Timer, TrainingStopped

if TYPE_CHECKING:
    from rlplane.training.session import Session

TRAIN_PARTITION = "train"


def transform_rewards(cfg: RunConfig, carry: dict[str, torch.Tensor]) -> torch.Tensor:
    """The loop's reward scaling, then its reward shaping, of ``carry["rewards"]``; returns (B,)."""
    g = cfg.loop
    rewards = scale_rewards(carry["rewards"], **g.reward_scaling.model_dump())
    shaping = g.reward_shaping.model_dump()
    shaping["max_response_length"] = shaping["max_response_length"] or cfg.policy.max_total_sequence_length
    return apply_reward_shaping(rewards, carry["response_lengths"], carry["truncated"], **shaping)


def collect_rollouts(
    s: Session, timer: Timer, metrics: dict[str, float]
) -> tuple[KVBatchMeta, dict[str, torch.Tensor]]:
    """Rollouts of one step into ``TRAIN_PARTITION``: reward scaling → shaping → dynamic sampling
    (drop all-equal groups, clear their keys, refill) → keep the first prompts × generations.

    Returns the receipt and the (B,) carry (``rewards`` shaped, ``group`` distinct across batches).
    Adds ``reward`` (raw, first batch), the generation metrics and the dynamic-sampling counts.
    """
    cfg, g = s.cfg, s.cfg.loop
    G = g.num_generations_per_prompt
    target = g.num_prompts_per_step * G
    pending, carry, num_gen_batches, discarded = None, None, 0, 0
    while True:
        num_gen_batches += 1
        datums = s.prompts.next()
        with timer("generation"):
            meta, c, gen_metrics = s.workers.rollout.call("rollout", datums, group_size=G, partition_id=TRAIN_PARTITION)
        metrics.setdefault("reward", float(c["rewards"].mean()))  # before shaping, first batch
        rewards = c["rewards"] = transform_rewards(cfg, c)
        group = c["group"] + (0 if carry is None else int(carry["group"].max()) + 1)  # keep groups distinct
        c["group"] = group
        if g.use_dynamic_sampling:
            keep = dynamic_sampling_keep_mask(group, rewards)  # all-equal groups carry no signal: drop them
            dropped = [k for k, kept in zip(meta.sample_ids, keep.tolist()) if not kept]
            if dropped:
                s.data_plane.clear_samples(dropped, TRAIN_PARTITION)
                discarded += len(dropped)
            idx = keep.nonzero().squeeze(1)
            meta = meta.subset(idx.tolist())
            c = {k: v[idx] for k, v in c.items()}
        pending = meta if pending is None else pending.concat([meta])
        carry = c if carry is None else {k: torch.cat([carry[k], c[k]]) for k in carry}
        if not g.use_dynamic_sampling or len(pending) >= target:
            break
        if num_gen_batches >= g.dynamic_sampling_max_gen_batches:
            raise TrainingStopped(
                f"dynamic sampling: only {len(pending)} of {target} samples had non-zero reward std after "
                f"{num_gen_batches} generation batches ({cfg.algorithm}.dynamic_sampling_max_gen_batches); raise "
                "it, or make the task less saturated"
            )
    meta = pending
    if len(meta) > target:  # overflow from the last batch: clear the extra keys, keep the first `target`
        s.data_plane.clear_samples(list(meta.sample_ids[target:]), TRAIN_PARTITION)
        meta = meta.slice(0, target)
        carry = {k: v[:target] for k, v in carry.items()}
    metrics.update(gen_metrics)
    if g.use_dynamic_sampling:
        metrics["dynamic_sampling_num_gen_batches"] = num_gen_batches
        metrics["dynamic_sampling_num_discarded_valid_samples"] = discarded
    return meta, carry


def stamp_sample_mask(cfg: RunConfig, meta: KVBatchMeta, carry: dict[str, torch.Tensor]) -> tuple[KVBatchMeta, torch.Tensor]:
    """The (B,) sample mask (``loss_multiplier``, times not-truncated with ``overlong_filtering``),
    stamped on the receipt's tags where the workers read it; returns the receipt and the mask."""
    sample_mask = carry["loss_multiplier"].clone()
    if cfg.loop.overlong_filtering:
        sample_mask = sample_mask * (~carry["truncated"]).float()
    return meta.stamp_tags([{"sample_mask": float(m)} for m in sample_mask.tolist()]), sample_mask


def mask_logprob_errors(
    s: Session, meta: KVBatchMeta, carry: dict[str, torch.Tensor], sample_mask: torch.Tensor, metrics: dict[str, float]
) -> tuple[KVBatchMeta, torch.Tensor]:
    """``seq_logprob_error_threshold``: drop sequences whose generation and prev logprobs disagree.
    The one place the driver reads per-token columns (masking needs whole sequences' errors), and
    only when the config asks for it. Returns the re-stamped receipt and the new (B,) mask."""
    cols = s.data_plane.get_samples(meta, TRAIN_PARTITION, [GENERATION_LOGPROBS, PREV_LOGPROBS, TOKEN_MASK])
    sample_mask, seq_metrics = seq_logprob_error_mask(
        cols[GENERATION_LOGPROBS][:, 1:], cols[PREV_LOGPROBS][:, 1:], cols[TOKEN_MASK][:, 1:].float(),
        sample_mask, s.cfg.loop.seq_logprob_error_threshold, rewards=carry["rewards"],
    )
    metrics.update({k: float(v) for k, v in seq_metrics.items()})
    return meta.stamp_tags([{"sample_mask": float(m)} for m in sample_mask.tolist()]), sample_mask


def rollout_metrics(carry: dict[str, torch.Tensor], lengths: list[int]) -> dict[str, float]:
    """Reward and group statistics of the step's samples (after shaping and sampling)."""
    out = {"filtered_reward": float(carry["rewards"].mean())}
    # Per prompt group: all responses wrong (no signal), all right (no signal), or mixed.
    groups, inverse = torch.unique(carry["group"], return_inverse=True)
    group_mean = torch.zeros(len(groups)).scatter_add_(0, inverse, carry["rewards"]) / torch.bincount(inverse)
    out["baseline_reward/pct_0"] = float((group_mean == 0).float().mean())
    out["baseline_reward/pct_1"] = float((group_mean == 1).float().mean())
    out["baseline_reward/pct_mixed"] = 1.0 - out["baseline_reward/pct_0"] - out["baseline_reward/pct_1"]
    out["truncated_fraction"] = float(carry["truncated"].float().mean())
    out["total_num_tokens"] = float(sum(lengths))
    return out
