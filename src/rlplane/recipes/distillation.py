"""On-policy distillation: the student generates, a frozen teacher scores the student's own tokens, and the
student minimises a KL to the teacher on them.

``loss_fn.kl_type`` forward / reverse / mixed (NeMo RL's): the teacher writes its ``distillation.topk_logits_k``
largest logits of every token and their ids as columns, the student's logits are compared with them
(:mod:`rlplane.algorithms.distillation_kl`). ``sampled_reverse``: the teacher writes its logprob of each sampled
token and the student minimises the per-token sampled reverse KL (:func:`~rlplane.algorithms.reverse_kl_loss`),
one optimizer step per rollout, as that estimate is on-policy only for the weights that sampled it.

Each step: refit → rollouts (rewards for metrics) → sample mask → the teacher's columns → train → clear the keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlplane.algorithms.distillation_kl import topk_distillation_logprobs, topk_kl_loss
from rlplane.algorithms.loss_options import DistillationLossOptions
from rlplane.algorithms.losses import reverse_kl_loss
from rlplane.config.schema import RunConfig
from rlplane.dataplane.columns import (
    GENERATION_LOGPROBS,
    INPUT_IDS,
    TEACHER_LOGPROBS,
    TEACHER_TOPK_INDICES,
    TEACHER_TOPK_LOGITS,
    TOKEN_MASK,
)
from rlplane.runtime.interrupts import StopSignals
from rlplane.training import Components, DataExhausted, Session, Timer
from rlplane.training.rollouts import TRAIN_PARTITION, collect_rollouts, rollout_metrics, stamp_sample_mask
from rlplane.utils.metrics import merge_rank_metrics
from rlplane.workers.teacher import TeacherWorker

TRAIN_COLUMNS = [INPUT_IDS, TOKEN_MASK, GENERATION_LOGPROBS, TEACHER_LOGPROBS]
TOPK_TRAIN_COLUMNS = [INPUT_IDS, TOKEN_MASK, GENERATION_LOGPROBS, TEACHER_TOPK_LOGITS, TEACHER_TOPK_INDICES]


@dataclass(frozen=True)
class ReverseKLLoss:
    """The policy workers' loss: the sampled per-token reverse KL to the teacher."""

    def columns(self) -> list[str]:
        return [TOKEN_MASK, TEACHER_LOGPROBS]

    def __call__(self, curr_logprobs, batch, sample_mask, global_valid_tokens, _global_valid_seqs):
        return reverse_kl_loss(curr_logprobs, batch[TEACHER_LOGPROBS], batch[TOKEN_MASK], sample_mask,
                               global_valid_tokens)


@dataclass(frozen=True)
class TopKDistillationLoss:
    """The policy workers' loss for NeMo RL's top-k distillation: the student's next-token logits against the
    teacher's top-k columns (forward, reverse or mixed KL)."""

    options: DistillationLossOptions
    wants_logits: ClassVar[bool] = True  # the worker hands over (b, L-1, V) logits, not logprobs

    def columns(self) -> list[str]:
        return [TOKEN_MASK, TEACHER_TOPK_LOGITS, TEACHER_TOPK_INDICES]

    def __call__(self, logits, batch, sample_mask, global_valid_tokens, _global_valid_seqs):
        o, width = self.options, logits.shape[1]  # the micro-batch's width may be under the batch's
        student, teacher, neg_entropy = topk_distillation_logprobs(
            logits, batch[TEACHER_TOPK_LOGITS][:, :width], batch[TEACHER_TOPK_INDICES][:, :width],
            zero_outside_topk=o.zero_outside_topk, want_entropy=o.zero_outside_topk and o.kl_type != "forward")
        return topk_kl_loss(student, teacher, batch[TOKEN_MASK][:, :width], sample_mask, global_valid_tokens,
                            kl_type=o.kl_type, mixed_kl_weight=o.mixed_kl_weight, student_neg_entropy=neg_entropy)


def distillation_loss(cfg: RunConfig) -> ReverseKLLoss | TopKDistillationLoss:
    """The loss ``loss_fn.kl_type`` names."""
    options = cfg.loss_fn.distillation_options()
    return TopKDistillationLoss(options) if options.topk else ReverseKLLoss()


def distillation_step(s: Session, loss, step: int) -> dict[str, float]:
    """One distillation step; returns its metrics (train/*, timing/train/*)."""
    g = s.cfg.distillation
    topk = s.cfg.loss_fn.distillation_options().topk
    timer = Timer()
    metrics: dict[str, float] = {}

    with timer("refit"):
        s.refit.if_stale()
    s.data_plane.register_partition(TRAIN_PARTITION, TOPK_TRAIN_COLUMNS if topk else TRAIN_COLUMNS,
                                    s.plan.sizes.samples_per_step)

    # ---- the student's rollouts; the sample mask ------------------------------------------------
    meta, carry = collect_rollouts(s, timer, metrics)
    s.refit.release()  # colocated: the generators sleep while the policy trains
    meta, _ = stamp_sample_mask(g.overlong_filtering, meta, carry)

    # ---- the teacher scores the student's tokens, written back per sample ------------------------
    with timer("teacher_logprobs"):
        if topk:  # its k largest logits of every token, and their ids
            s.workers.teacher.run_sharded(TeacherWorker.compute_topk_logits, meta, k=g.topk_logits_k)
        else:
            s.workers.teacher.run_sharded(TeacherWorker.compute_logprobs, meta, out_field=TEACHER_LOGPROBS)

    # ---- train on the KL; the step is over ------------------------------------------------------
    with timer("policy_training"):
        results = s.policy.train_from_meta(meta, loss)
    s.refit.mark_stale()
    s.data_plane.clear_samples(None, TRAIN_PARTITION, wait=False)  # nobody needs the answer: do not wait

    metrics.update(merge_rank_metrics(results))
    metrics.update(rollout_metrics(carry, meta.seq_lens))
    return {**{f"train/{k}": v for k, v in metrics.items()}, **timer.metrics()}


def train(cfg: RunConfig, *, quiet: bool = False, components: Components | None = None,
          signals: StopSignals | None = None) -> dict:
    """Run the whole job: warm-up of student and teacher (or resume), steps, validation, checkpoints."""
    with Session(cfg, quiet, components=components, signals=signals) as s:  # the teacher: the plan's teacher role
        loss = s.components.loss_fn or distillation_loss(cfg)
        for step in range(s.start(), s.last_step()):
            s.begin_step(step)
            try:
                metrics = distillation_step(s, loss, step)
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
