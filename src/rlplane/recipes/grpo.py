"""Synchronous GRPO through the data plane, in the order the seeds run it.

Each step: refit → rollouts into the step's partition → reward scaling/shaping → dynamic sampling → sample
mask → prev and reference logprobs → advantages → train with the clipped PG loss → clear the step's keys.
The driver holds only receipts and (B,) tensors.
"""

from __future__ import annotations

import torch

from rlplane.config.schema import RunConfig
from rlplane.dataplane.columns import (
    ADVANTAGES,
    GENERATION_LOGPROBS,
    INPUT_IDS,
    PREV_LOGPROBS,
    REFERENCE_LOGPROBS,
    TOKEN_MASK,
)
from rlplane.runtime.interrupts import StopSignals
from rlplane.training import Components, DataExhausted, Session, Timer
from rlplane.training.advantages import estimator_advantages
from rlplane.training.rollouts import (
    TRAIN_PARTITION,
    add_train_metrics,
    collect_rollouts,
    policy_logprobs,
    rollout_metrics,
    stamp_sample_mask,
)
from rlplane.training.samples import train_samples
from rlplane.utils.metrics import merge_rank_metrics
from rlplane.workers.policy import ClippedPGLoss

# The step's columns: written at rollout, by the policy workers (logprobs) and by the driver (advantages).
TRAIN_COLUMNS = [INPUT_IDS, TOKEN_MASK, GENERATION_LOGPROBS, PREV_LOGPROBS, REFERENCE_LOGPROBS, ADVANTAGES]


def grpo_step(s: Session, loss: ClippedPGLoss, step: int) -> dict[str, float]:
    """One GRPO step; returns its metrics (train/*, timing/train/*)."""
    g = s.cfg.grpo
    timer = Timer()
    metrics: dict[str, float] = {}

    with timer("refit"):
        s.refit.if_stale()
    s.data_plane.register_partition(TRAIN_PARTITION, TRAIN_COLUMNS, s.plan.sizes.samples_per_step)

    # ---- rollout, rewards, dynamic sampling; the sample mask ------------------------------------
    meta, carry = collect_rollouts(s, timer, metrics)
    s.refit.release()  # colocated: the generators sleep while the policy trains
    meta, sample_mask = stamp_sample_mask(g.overlong_filtering, meta, carry)

    # ---- prev and reference logprobs, written back by the policy workers -------------------------
    meta, sample_mask = policy_logprobs(s, meta, carry, sample_mask, loss, timer, metrics)

    # ---- advantages (grpo.adv_estimator), written back per sample ----------------------------------
    with timer("advantages"):
        rows, adv_metrics = estimator_advantages(s, meta, carry, sample_mask)
    metrics.update(adv_metrics)
    if s.log.train_samples_due():  # logger.log_train_samples_every; per-token advantages shown as their mean
        shown = torch.stack([r.float().mean() if len(r) else torch.zeros(()) for r in rows])  # (B,)
        s.log.add_samples("train", train_samples(s, meta, carry, shown, TRAIN_PARTITION))
    s.data_plane.put_samples(list(meta.sample_ids), TRAIN_PARTITION, {ADVANTAGES: rows})

    # ---- train; the step is over ----------------------------------------------------------------
    with timer("policy_training"):
        results = s.policy.train_from_meta(meta, loss)
    s.refit.mark_stale()
    s.data_plane.clear_samples(None, TRAIN_PARTITION, wait=False)  # nobody needs the answer: do not wait

    add_train_metrics(metrics, merge_rank_metrics(results))
    metrics.update(rollout_metrics(carry, meta.seq_lens))
    return {**{f"train/{k}": v for k, v in metrics.items()}, **timer.metrics()}


def train(cfg: RunConfig, *, quiet: bool = False, components: Components | None = None,
          signals: StopSignals | None = None) -> dict:
    """Run the whole job: warm-up (or resume), GRPO steps, validation, checkpoints. Returns a summary."""
    with Session(cfg, quiet, components=components, signals=signals) as s:
        loss = s.components.loss_fn or ClippedPGLoss(cfg.loss_fn.options(), reference=s.plan.needs_reference,
                                                     prev_from_forward=s.plan.skips_prev_logprob_forward)
        for step in range(s.start(), s.last_step()):
            s.begin_step(step)
            try:
                metrics = grpo_step(s, loss, step)
            except DataExhausted as e:  # max_num_epochs used up inside a step (dynamic sampling)
                s.stop_early(step, e)
                break
            done = s.trained(step)
            s.validate_if_due(done, metrics)
            s.log_step(done, metrics)
            saved = s.checkpoint_if_due(done, metrics)
            if s.should_stop(done, metrics, saved):
                break
        return s.summary()
