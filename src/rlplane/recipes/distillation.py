"""On-policy distillation: the student generates, a frozen teacher scores the student's own tokens, and the
student minimises the per-token reverse KL to the teacher on them.

Each step: refit → rollouts (rewards for metrics) → sample mask → ``teacher_logprobs`` → train on
:func:`~rlplane.algorithms.reverse_kl_loss` → clear the step's keys. One optimizer step per rollout, as the
estimate is on-policy only for the weights that sampled it.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlplane.algorithms.losses import reverse_kl_loss
from rlplane.config.schema import RunConfig
from rlplane.dataplane.columns import GENERATION_LOGPROBS, INPUT_IDS, TEACHER_LOGPROBS, TOKEN_MASK
from rlplane.runtime.interrupts import StopSignals
from rlplane.training import Components, DataExhausted, Session, Timer
from rlplane.training.rollouts import TRAIN_PARTITION, collect_rollouts, rollout_metrics, stamp_sample_mask
from rlplane.utils.metrics import merge_rank_metrics
from rlplane.workers.teacher import TeacherWorker

TRAIN_COLUMNS = [INPUT_IDS, TOKEN_MASK, GENERATION_LOGPROBS, TEACHER_LOGPROBS]


@dataclass(frozen=True)
class ReverseKLLoss:
    """The policy workers' loss: the sampled per-token reverse KL to the teacher."""

    def columns(self) -> list[str]:
        return [TOKEN_MASK, TEACHER_LOGPROBS]

    def __call__(self, curr_logprobs, batch, sample_mask, global_valid_tokens, _global_valid_seqs):
        return reverse_kl_loss(curr_logprobs, batch[TEACHER_LOGPROBS], batch[TOKEN_MASK], sample_mask,
                               global_valid_tokens)


def distillation_step(s: Session, loss: ReverseKLLoss, step: int) -> dict[str, float]:
    """One distillation step; returns its metrics (train/*, timing/train/*)."""
    g = s.cfg.distillation
    timer = Timer()
    metrics: dict[str, float] = {}

    with timer("refit"):
        s.refit.if_stale()
    s.data_plane.register_partition(TRAIN_PARTITION, TRAIN_COLUMNS, s.plan.sizes.samples_per_step)

    # ---- the student's rollouts; the sample mask ------------------------------------------------
    meta, carry = collect_rollouts(s, timer, metrics)
    s.refit.release()  # colocated: the generators sleep while the policy trains
    meta, _ = stamp_sample_mask(g.overlong_filtering, meta, carry)

    # ---- the teacher scores the student's tokens, written back per sample ------------------------
    with timer("teacher_logprobs"):
        s.workers.teacher.run_sharded(TeacherWorker.compute_logprobs, meta, out_field=TEACHER_LOGPROBS)

    # ---- train on the reverse KL; the step is over ----------------------------------------------
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
        loss = s.components.loss_fn or ReverseKLLoss()
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
