"""Synchronous GRPO through the data plane, in the order the seeds run it.

Each step: refit the generator if stale → register the step's partition → rollout writes columns
under per-sample keys, returns a receipt and a small carry → reward scaling/shaping, baselines →
dynamic sampling (drop zero-std groups, clear their keys, refill) → overlong filtering → prev and
reference logprobs computed by the policy workers and written back → advantages written back by
the driver → workers train on their shard → clear the step's keys → validate → checkpoint.
The driver holds only receipts and (B,) tensors. The steps shared with PPO live in ``common.py``.
"""

from __future__ import annotations

import time

import torch

from rlplane.algorithms.advantages import clip_advantages, grpo_advantages
from rlplane.config.schema import RunConfig
from rlplane.dataplane import KVBatchMeta
from rlplane.recipes.common import (
    TRAIN_PARTITION,
    Timer,
    TrainingStopped,
    collect_rollouts,
    masks_and_logprobs,
    rollout_metrics,
    run_training,
    validate,
)
from rlplane.recipes.samples import train_samples
from rlplane.recipes.setup import Session
from rlplane.utils.metrics import merge_rank_metrics

__all__ = ["TRAIN_FIELDS", "TRAIN_PARTITION", "Timer", "TrainingStopped", "grpo_step", "train", "train_on_rollouts",
           "validate"]

# Columns of a GRPO step: written at rollout, by the logprob workers, and by the driver (advantages).
TRAIN_FIELDS = ["input_ids", "token_mask", "generation_logprobs", "prev_logprobs", "reference_policy_logprobs",
                "advantages"]


def grpo_step(s: Session, step: int) -> dict[str, float]:
    """One GRPO step; returns its metrics (train/*, timing/train/*)."""
    g = s.cfg.grpo
    t_step = time.perf_counter()
    timer = Timer()
    metrics: dict[str, float] = {}

    with timer("refit"):
        s.refit_if_stale()
    s.data_plane.register_partition(TRAIN_PARTITION, TRAIN_FIELDS, g.num_prompts_per_step * g.num_generations_per_prompt)

    # ---- rollout, rewards, dynamic sampling --------------------------------------------------------
    meta, carry = collect_rollouts(s, timer, metrics)
    out = train_on_rollouts(s, meta, carry, timer, metrics)
    out["timing/train/total_step_time"] = time.perf_counter() - t_step
    return out


def train_on_rollouts(
    s: Session, meta: KVBatchMeta, carry: dict[str, torch.Tensor], timer: Timer, metrics: dict[str, float]
) -> dict[str, float]:
    """The rest of a GRPO step once the rollouts are in ``TRAIN_PARTITION`` (sync and async alike):
    masks and logprobs → group-baseline advantages → train → clear the step's keys.
    Returns ``metrics`` and the step's results as ``train/*`` plus the timer's ``timing/train/*``."""
    cfg, g = s.cfg, s.cfg.grpo
    meta, _ = masks_and_logprobs(s, meta, carry, timer, metrics)

    # ---- advantages: group baselines, one value per sample ---------------------------------------
    est = g.adv_estimator
    adv = grpo_advantages(
        carry["group"],
        carry["rewards"],
        normalize_rewards=est.normalize_rewards,
        use_leave_one_out_baseline=est.use_leave_one_out_baseline,
        minus_baseline=est.minus_baseline,
    )  # (B,)
    adv = clip_advantages(adv, g.advantage_clip_low, g.advantage_clip_high)
    lengths = meta.seq_lens
    if s.train_samples_due():  # logger.log_train_samples_every
        s.pending_samples.append(("train", train_samples(s, meta, carry, adv, TRAIN_PARTITION)))
    s.data_plane.put_samples(
        list(meta.sample_ids), TRAIN_PARTITION, {"advantages": [adv[i].expand(lengths[i]).clone() for i in range(len(adv))]}
    )

    # ---- train -----------------------------------------------------------------------------------
    with timer("policy_training"):
        results = s.policy_sharded("train", meta, batch_size=cfg.policy.train_global_batch_size,
                                   loss_kwargs=s.loss_kwargs)
    s.mark_stale()
    s.data_plane.clear_samples(None, TRAIN_PARTITION, wait=False)  # the step is over: do not wait on the store

    metrics.update(merge_rank_metrics(results))
    metrics["filtered_reward"] = float(carry["rewards"].mean())
    metrics["advantages/mean"] = float(adv.mean())
    metrics["advantages/max"] = float(adv.max())
    metrics["advantages/min"] = float(adv.min())
    metrics.update(rollout_metrics(carry, lengths))
    out = {f"train/{k}": v for k, v in metrics.items()}
    out.update({f"timing/train/{k}": v for k, v in timer.times.items()})
    return out


def train(cfg: RunConfig, *, quiet: bool = False) -> dict:
    """Run the whole job: warm-up (or resume), GRPO steps, validation, checkpoints. Returns a summary."""
    return run_training(cfg, grpo_step, quiet=quiet)
