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

from rlplane.algorithms.advantages import (
    clip_advantages,
    gdpo_advantages,
    grpo_advantages,
    reinforce_plus_plus_advantages,
)
from rlplane.config.schema import RunConfig
from rlplane.dataplane import KVBatchMeta
from rlplane.recipes.common import (
    REWARD_COMPONENT_PREFIX,
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


def estimator_advantages(
    s: Session, meta: KVBatchMeta, carry: dict[str, torch.Tensor], sample_mask: torch.Tensor
) -> tuple[list[torch.Tensor], dict[str, float]]:
    """The step's advantages under ``grpo.adv_estimator.name``, one row per sample (its sequence
    length; only the ``token_mask`` positions are trained on), then ``advantage_clip_low/high``.

    - ``grpo``: :func:`~rlplane.algorithms.grpo_advantages`, one value per sample.
    - ``gdpo``: :func:`~rlplane.algorithms.gdpo_advantages` over the carry's ``reward/<name>``
      components (the environment's per-sample reward parts), one value per sample.
    - ``reinforce_plus_plus``: :func:`~rlplane.algorithms.reinforce_plus_plus_advantages` over the
      trained tokens (``token_mask · sample_mask``, read from the data plane: the whitening is a
      statistic of the whole batch), with ``β·KL(prev ‖ ref)`` in the reward if ``loss_fn.use_kl_in_reward``.

    Returns the rows and ``advantages/mean|max|min`` (over samples; over trained tokens for REINFORCE++).
    """
    g, lf = s.cfg.grpo, s.cfg.loss_fn
    est, lengths = g.adv_estimator, meta.seq_lens
    if est.name == "reinforce_plus_plus":
        kl_in_reward = lf.use_kl_in_reward and lf.reference_policy_kl_penalty != 0
        fields = ["token_mask"] + ["prev_logprobs", "reference_policy_logprobs"] * kl_in_reward
        cols = s.data_plane.get_samples(meta, TRAIN_PARTITION, fields)
        mask = cols["token_mask"].float() * sample_mask[:, None]  # (B, T): the tokens trained on
        kl = {}
        if kl_in_reward:
            kl = dict(kl_penalty=lf.reference_policy_kl_penalty, prev_logprobs=cols["prev_logprobs"],
                      reference_logprobs=cols["reference_policy_logprobs"], kl_type=lf.reference_policy_kl_type,
                      kl_input_clamp_value=lf.kl_input_clamp_value, kl_output_clamp_value=lf.kl_output_clamp_value)
        adv = reinforce_plus_plus_advantages(carry["group"], carry["rewards"], mask,
                                             minus_baseline=est.minus_baseline, **kl)  # (B, T)
        adv = clip_advantages(adv, g.advantage_clip_low, g.advantage_clip_high)
        on = mask != 0
        stats = adv[on] if on.any() else adv.new_zeros(1)
        rows = [adv[i, : lengths[i]] for i in range(len(lengths))]
    else:
        if est.name == "gdpo":
            components = {k[len(REWARD_COMPONENT_PREFIX):]: v for k, v in carry.items()
                          if k.startswith(REWARD_COMPONENT_PREFIX)}
            if len(components) < 2:
                raise TrainingStopped(
                    f"grpo.adv_estimator.name = gdpo: the environment gave {len(components)} reward components "
                    f"{sorted(components)}, GDPO needs at least 2 (e.g. task arithmetic: correct, format); "
                    "use an environment with reward components or set grpo.adv_estimator.name=grpo"
                )
            adv = gdpo_advantages(carry["group"], components, reward_weights=est.reward_weights,
                                  normalize_rewards=est.normalize_rewards,
                                  use_leave_one_out_baseline=est.use_leave_one_out_baseline)  # (B,)
        else:
            adv = grpo_advantages(carry["group"], carry["rewards"], normalize_rewards=est.normalize_rewards,
                                  use_leave_one_out_baseline=est.use_leave_one_out_baseline,
                                  minus_baseline=est.minus_baseline)  # (B,)
        adv = stats = clip_advantages(adv, g.advantage_clip_low, g.advantage_clip_high)
        rows = [adv[i].expand(lengths[i]).clone() for i in range(len(adv))]
    return rows, {"advantages/mean": float(stats.mean()), "advantages/max": float(stats.max()),
                  "advantages/min": float(stats.min())}


def train_on_rollouts(
    s: Session, meta: KVBatchMeta, carry: dict[str, torch.Tensor], timer: Timer, metrics: dict[str, float]
) -> dict[str, float]:
    """The rest of a GRPO step once the rollouts are in ``TRAIN_PARTITION`` (sync and async alike):
    masks and logprobs → group-baseline advantages → train → clear the step's keys.
    Returns ``metrics`` and the step's results as ``train/*`` plus the timer's ``timing/train/*``."""
    cfg = s.cfg
    meta, sample_mask = masks_and_logprobs(s, meta, carry, timer, metrics)

    # ---- advantages (grpo.adv_estimator), written back per sample ----------------------------------
    with timer("advantages"):
        rows, adv_metrics = estimator_advantages(s, meta, carry, sample_mask)
    metrics.update(adv_metrics)
    lengths = meta.seq_lens
    if s.train_samples_due():  # logger.log_train_samples_every; per-token advantages shown as their mean
        shown = torch.stack([r.float().mean() if len(r) else torch.zeros(()) for r in rows])  # (B,)
        s.pending_samples.append(("train", train_samples(s, meta, carry, shown, TRAIN_PARTITION)))
    s.data_plane.put_samples(list(meta.sample_ids), TRAIN_PARTITION, {"advantages": rows})

    # ---- train -----------------------------------------------------------------------------------
    with timer("policy_training"):
        results = s.policy_sharded("train", meta, batch_size=cfg.policy.train_global_batch_size,
                                   loss_kwargs=s.loss_kwargs)
    s.mark_stale()
    s.data_plane.clear_samples(None, TRAIN_PARTITION, wait=False)  # the step is over: do not wait on the store

    metrics.update(merge_rank_metrics(results))
    metrics["filtered_reward"] = float(carry["rewards"].mean())
    metrics.update(rollout_metrics(carry, lengths))
    out = {f"train/{k}": v for k, v in metrics.items()}
    out.update({f"timing/train/{k}": v for k, v in timer.times.items()})
    return out


def train(cfg: RunConfig, *, quiet: bool = False) -> dict:
    """Run the whole job: warm-up (or resume), GRPO steps, validation, checkpoints. Returns a summary."""
    return run_training(cfg, grpo_step, quiet=quiet)
