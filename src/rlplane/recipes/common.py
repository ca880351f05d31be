"""Building blocks every on-policy recipe (GRPO, PPO) runs in the same order: rollouts with reward
transforms and dynamic sampling, sample masks and logprobs, validation, and the outer loop
(warm-up or resume → steps → validation → logging → checkpoints). The loops in ``grpo.py`` and
``ppo.py`` call these; each reads its knobs from ``cfg.loop`` (``grpo.*`` or ``ppo.*``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager

import torch

from rlplane.algorithms.filters import (
    apply_reward_shaping,
    dynamic_sampling_keep_mask,
    scale_rewards,
    seq_logprob_error_mask,
)
from rlplane.config.schema import RunConfig
from rlplane.dataplane import KVBatchMeta
from rlplane.recipes.setup import Session, build_session

TRAIN_PARTITION = "train"


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
    g = s.cfg.loop
    datums = s.val_datums[: g.max_val_samples]
    correct, passed, samples = [], [], []
    for i in range(0, len(datums), g.val_batch_size):
        batch = datums[i : i + g.val_batch_size]
        _, carry, _ = s.rollout("rollout", batch, group_size=1, partition_id=None, greedy=True)
        correct.append(carry["rewards"])
        samples += s.rollout("last_samples")  # the greedy answers as text: samples.jsonl at the next log
        k = g.val_num_generations_per_prompt
        if k > 1:
            _, carry, _ = s.rollout("rollout", batch, group_size=k, partition_id=None, greedy=False)
            passed.append((carry["rewards"].view(-1, k) > 0).any(dim=1).float())
    s.pending_samples.append(("validation", samples))
    out = {"accuracy": float(torch.cat(correct).double().mean())}
    if passed:
        out[f"pass@{g.val_num_generations_per_prompt}"] = float(torch.cat(passed).double().mean())
    return out


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
        datums = s.next_prompts()
        with timer("generation"):
            meta, c, gen_metrics = s.rollout("rollout", datums, group_size=G, partition_id=TRAIN_PARTITION)
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


def masks_and_logprobs(
    s: Session, meta: KVBatchMeta, carry: dict[str, torch.Tensor], timer: Timer, metrics: dict[str, float]
) -> tuple[KVBatchMeta, torch.Tensor]:
    """Sample mask (``loss_multiplier``, overlong filtering) stamped on the receipt → prev and
    reference logprobs written back by the policy workers → the sequence logprob-error mask.
    Returns the re-stamped receipt and the (B,) ``sample_mask``."""
    cfg, g = s.cfg, s.cfg.loop
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
    return meta, sample_mask


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


def run_training(cfg: RunConfig, step_fn: Callable[[Session, int], dict[str, float]], *, quiet: bool = False) -> dict:
    """The outer loop of a recipe: warm-up (or resume), ``step_fn`` per step, validation every
    ``val_period`` steps, logging, checkpoints. Returns the run summary."""
    s = build_session(cfg, quiet=quiet)
    g = cfg.loop
    try:
        start = s.resume_or_warm_up()
        if start == 0 and g.val_at_start:
            s.initial_validation = {f"validation/{k}": v for k, v in validate(s).items()}
            s.log(s.initial_validation, step=0)
        last_val = dict(s.initial_validation)
        for step in range(start, g.max_num_steps):
            metrics = step_fn(s, step)
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
