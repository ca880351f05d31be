"""Synchronous GRPO through the data plane, in the order the seeds run it.

Each step: refit the generator if stale → register the step's partition → rollout writes columns
under per-sample keys, returns a receipt and a small carry → reward scaling/shaping, baselines →
dynamic sampling (drop zero-std groups, clear their keys, refill) → overlong filtering → prev and
reference logprobs computed by the policy workers and written back → advantages written back by
the driver → workers train on their shard → clear the step's keys → validate → checkpoint.
The driver holds only receipts and (B,) tensors.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from rlplane.algorithms.advantages import clip_advantages, grpo_advantages
from rlplane.algorithms.filters import (
    apply_reward_shaping,
    dynamic_sampling_keep_mask,
    scale_rewards,
    seq_logprob_error_mask,
)
from rlplane.config.schema import RunConfig
from rlplane.recipes.setup import Session, build_session
from rlplane.utils.metrics import merge_rank_metrics

TRAIN_PARTITION = "train"
# Columns of a GRPO step: written at rollout, by the logprob workers, and by the driver (advantages).
TRAIN_FIELDS = ["input_ids", "token_mask", "generation_logprobs", "prev_logprobs", "reference_policy_logprobs",
                "advantages"]


class TrainingStopped(RuntimeError):
    """The run cannot go on for a reason the user can act on (one-line message)."""


class Timer:
    def __init__(self):
        self.times: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        yield
        self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t0


def validate(s: Session) -> dict[str, float]:
    """Greedy accuracy on the held-out set (and pass@k with k sampled generations when k > 1)."""
    g = s.cfg.grpo
    datums = s.val_datums[: g.max_val_samples]
    correct, passed = [], []
    for i in range(0, len(datums), g.val_batch_size):
        batch = datums[i : i + g.val_batch_size]
        _, carry, _ = s.rollout("rollout", batch, group_size=1, partition_id=None, greedy=True)
        correct.append(carry["rewards"])
        k = g.val_num_generations_per_prompt
        if k > 1:
            _, carry, _ = s.rollout("rollout", batch, group_size=k, partition_id=None, greedy=False)
            passed.append((carry["rewards"].view(-1, k) > 0).any(dim=1).float())
    out = {"accuracy": float(torch.cat(correct).double().mean())}
    if passed:
        out[f"pass@{g.val_num_generations_per_prompt}"] = float(torch.cat(passed).double().mean())
    return out


def grpo_step(s: Session, step: int) -> dict[str, float]:
    """One GRPO step; returns its metrics (train/*, timing/train/*)."""
    cfg, g = s.cfg, s.cfg.grpo
    t_step = time.perf_counter()
    timer = Timer()
    metrics: dict[str, float] = {}
    G = g.num_generations_per_prompt
    target = g.num_prompts_per_step * G

    with timer("refit"):
        s.refit_if_stale()
    s.data_plane.register_partition(TRAIN_PARTITION, TRAIN_FIELDS, target)

    # ---- rollout, rewards, baselines, dynamic sampling -----------------------------------------
    pending, carry, num_gen_batches, discarded = None, None, 0, 0
    while True:
        num_gen_batches += 1
        datums = s.next_prompts()
        with timer("generation"):
            meta, c, gen_metrics = s.rollout("rollout", datums, group_size=G, partition_id=TRAIN_PARTITION)
        rewards = c["rewards"]  # (B,)
        metrics.setdefault("reward", float(rewards.mean()))  # before shaping, first batch
        rewards = scale_rewards(rewards, **g.reward_scaling.model_dump())
        shaping = g.reward_shaping.model_dump()
        shaping["max_response_length"] = shaping["max_response_length"] or cfg.policy.max_total_sequence_length
        rewards = apply_reward_shaping(rewards, c["response_lengths"], c["truncated"], **shaping)
        c["rewards"] = rewards
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
                f"{num_gen_batches} generation batches (grpo.dynamic_sampling_max_gen_batches); raise it, or "
                "make the task less saturated"
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

    # ---- masks, logprobs, advantages -----------------------------------------------------------
    sample_mask = carry["loss_multiplier"].clone()
    if g.overlong_filtering:
        sample_mask = sample_mask * (~carry["truncated"]).float()
    meta = meta.stamp_tags([{"sample_mask": float(m)} for m in sample_mask.tolist()])
    with timer("logprobs"):
        if not cfg.loss_fn.force_on_policy_ratio:
            s.policy_sharded("compute_logprobs", meta, out_field="prev_logprobs")
        if s.needs_reference:
            s.policy_sharded("compute_logprobs", meta, out_field="reference_policy_logprobs", reference=True)
    if g.seq_logprob_error_threshold is not None:
        # The one place the driver reads per-token columns: masking needs whole sequences' errors.
        cols = s.data_plane.get_samples(meta, TRAIN_PARTITION, ["generation_logprobs", "prev_logprobs", "token_mask"])
        sample_mask, seq_metrics = seq_logprob_error_mask(
            cols["generation_logprobs"][:, 1:], cols["prev_logprobs"][:, 1:], cols["token_mask"][:, 1:].float(),
            sample_mask, g.seq_logprob_error_threshold, rewards=carry["rewards"],
        )
        metrics.update({k: float(v) for k, v in seq_metrics.items()})
        meta = meta.stamp_tags([{"sample_mask": float(m)} for m in sample_mask.tolist()])
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
    s.data_plane.put_samples(
        list(meta.sample_ids), TRAIN_PARTITION, {"advantages": [adv[i].expand(lengths[i]).clone() for i in range(len(adv))]}
    )

    # ---- train -----------------------------------------------------------------------------------
    with timer("policy_training"):
        results = s.policy_sharded("train", meta, batch_size=cfg.policy.train_global_batch_size,
                                   loss_kwargs=s.loss_kwargs)
    s.mark_stale()
    s.data_plane.clear_samples(None, TRAIN_PARTITION)

    train = merge_rank_metrics(results)
    metrics.update(train)
    metrics["filtered_reward"] = float(carry["rewards"].mean())
    metrics["advantages/mean"] = float(adv.mean())
    metrics["advantages/max"] = float(adv.max())
    metrics["advantages/min"] = float(adv.min())
    # Per prompt group: all responses wrong (no signal), all right (no signal), or mixed.
    groups, inverse = torch.unique(carry["group"], return_inverse=True)
    group_mean = torch.zeros(len(groups)).scatter_add_(0, inverse, carry["rewards"]) / torch.bincount(inverse)
    metrics["baseline_reward/pct_0"] = float((group_mean == 0).float().mean())
    metrics["baseline_reward/pct_1"] = float((group_mean == 1).float().mean())
    metrics["baseline_reward/pct_mixed"] = 1.0 - metrics["baseline_reward/pct_0"] - metrics["baseline_reward/pct_1"]
    metrics["truncated_fraction"] = float(carry["truncated"].float().mean())
    metrics["total_num_tokens"] = float(sum(lengths))
    out = {f"train/{k}": v for k, v in metrics.items()}
    out.update({f"timing/train/{k}": v for k, v in timer.times.items()})
    out["timing/train/total_step_time"] = time.perf_counter() - t_step
    return out


def train(cfg: RunConfig, *, quiet: bool = False) -> dict:
    """Run the whole job: warm-up (or resume), GRPO steps, validation, checkpoints. Returns a summary."""
    s = build_session(cfg, quiet=quiet)
    g = cfg.grpo
    try:
        start = s.resume_or_warm_up()
        if start == 0 and g.val_at_start:
            s.initial_validation = {f"validation/{k}": v for k, v in validate(s).items()}
            s.log(s.initial_validation, step=0)
        last_val = dict(s.initial_validation)
        for step in range(start, g.max_num_steps):
            metrics = grpo_step(s, step)
            done = step + 1
            if (g.val_period and done % g.val_period == 0) or (g.val_at_end and done == g.max_num_steps):
                s.refit_if_stale()
                t0 = time.perf_counter()
                last_val = {f"validation/{k}": v for k, v in validate(s).items()}
                metrics.update(last_val)
                metrics["timing/validation/total"] = time.perf_counter() - t0
            s.log(metrics, step=done)
            if s.checkpoint_due(done):
                s.save_checkpoint(done, metrics)
        return s.summary(last_val)
    finally:
        s.close()
