"""Building blocks of an on-policy step, in order: rollouts with reward transforms and dynamic sampling,
the sample mask, the logprob-error filter, the rollout metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rlplane.algorithms.controls import control_generator, control_rewards
from rlplane.algorithms.filters import (
    ALL_EQUAL_GROUPS_HINT,
    apply_reward_shaping,
    dynamic_sampling_keep_mask,
    dynamic_sampling_select,
    failed_group_keep_mask,
    overlong_filter_sample_mask,
    scale_rewards,
    seq_logprob_error_mask,
)
from rlplane.config.loops import RolloutLoopConfig
from rlplane.dataplane import KVBatchMeta, concat_metas
from rlplane.dataplane.columns import GENERATION_LOGPROBS, PREV_LOGPROBS, REFERENCE_LOGPROBS, TOKEN_MASK
from rlplane.training.loop import DataExhausted, Timer, TrainingStopped
from rlplane.utils.kill_points import kill_point
from rlplane.workers.env_metrics import merge_env_metrics
from rlplane.workers.failures import FAILED_GROUPS_HINT, FAILURE_COUNTS, add_failure_counts

if TYPE_CHECKING:
    from rlplane.training.session import Session

TRAIN_PARTITION = "train"
REWARD_COMPONENT_PREFIX = "reward/"  # carry keys of per-sample reward components (GDPO)


def transform_rewards(
    loop: RolloutLoopConfig, max_total_sequence_length: int, carry: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scaled, shaped)`` (B,) rewards: the loop's reward scaling, then shaping of the total.

    Dynamic sampling filters on ``scaled`` (NeMo RL's ``unshaped_total_reward``), advantages use ``shaped``;
    ``reward/<name>`` components are scaled too. ``max_response_length`` defaults to the sequence cap.
    """
    scaling = loop.reward_scaling.model_dump()
    for key in [k for k in carry if k.startswith(REWARD_COMPONENT_PREFIX)]:
        carry[key] = scale_rewards(carry[key], **scaling)
    scaled = scale_rewards(carry["rewards"], **scaling)
    shaping = loop.reward_shaping.model_dump()
    shaping["max_response_length"] = shaping["max_response_length"] or max_total_sequence_length
    return scaled, apply_reward_shaping(scaled, carry["response_lengths"], carry["truncated"], **shaping)


def apply_reward_control(loop: RolloutLoopConfig, sample_ids, carry: dict[str, torch.Tensor]) -> None:
    """``loop.reward_control``: the batch's ``rewards`` and ``reward/<name>`` components replaced in ``carry`` by
    uninformative ones (:mod:`rlplane.algorithms.controls`), drawn from the run's seed and the batch's sample keys."""
    if loop.reward_control is None:
        return
    keys = ["rewards", *sorted(k for k in carry if k.startswith(REWARD_COMPONENT_PREFIX))]
    carry.update(control_rewards(loop.reward_control, {k: carry[k] for k in keys},
                                 control_generator(loop.seed, sample_ids)))


def batches_available(s: Session) -> int:
    """Generation batches the loader may still give before ``max_num_epochs`` passes are done."""
    loader, g = s.prompts.loader, s.cfg.loop
    consumed = loader.epoch * len(loader) + loader.batches_done_in_epoch
    return g.max_num_epochs * len(loader) - consumed


def collect_rollouts(
    s: Session, timer: Timer, metrics: dict[str, float]
) -> tuple[KVBatchMeta, dict[str, torch.Tensor]]:
    """Rollouts of one step into ``TRAIN_PARTITION``: scaling → shaping → dynamic sampling on the unshaped
    reward (or ``drop_group``, :mod:`rlplane.workers.failures`), refilled until B samples; unselected keys cleared.

    Returns the receipt and the (B,) carry (shaped ``rewards``, ``group`` distinct across batches). Metrics:
    ``reward`` (raw mean over every generation batch, NeMo RL's ``pending_unfiltered_rewards``), generation
    metrics, ``dynamic_sampling_num_gen_batches`` and ``_num_discarded_valid_samples``. Raises
    :class:`DataExhausted` when ``max_num_epochs`` is used up.
    """
    cfg, g = s.cfg, s.cfg.loop
    G, target = s.plan.sizes.generations_per_prompt, s.plan.sizes.samples_per_step
    metas, carries, keep_masks, num_groups = [], [], [], 0
    raw_rewards = []  # (B_i,) per generation batch, before scaling, shaping and the selection
    drop_failed = g.rollout_failure_policy == "drop_group"  # failed groups are dropped and refilled too
    # Short after the last batch: fill with all-equal groups (the config refuses fill with drop_group).
    fill = g.dynamic_sampling_shortfall == "fill"
    failures = dict.fromkeys(FAILURE_COUNTS, 0.0)
    env_parts = []  # each generation batch's metrics: the environments' env/* merge over all of them
    while True:
        if batches_available(s) <= 0:
            s.data_plane.clear_samples(None, TRAIN_PARTITION)  # the step's samples so far: it will not run
            raise DataExhausted(f"{cfg.algorithm}.max_num_epochs = {g.max_num_epochs} "
                                "passes over the training data done")
        if metas:  # a refill: the batches drawn so far did not give the step its target
            kill_point("refill")
        datums = s.prompts.next()
        with timer("generation"):
            meta, c, gen_metrics = s.workers.rollout.rollout(datums, group_size=G, partition_id=TRAIN_PARTITION)
        raw_rewards.append(c["rewards"])
        env_parts.append(gen_metrics)
        metrics["reward"] = float(torch.cat(raw_rewards).mean())  # the task's, also in a control run
        apply_reward_control(g, meta.sample_ids, c)
        c["group"] = c["group"] + num_groups  # distinct across batches, whatever each batch kept
        num_groups += len(datums)
        unshaped, c["rewards"] = transform_rewards(g, cfg.policy.max_total_sequence_length, c)
        failures = add_failure_counts(failures, gen_metrics, c, drop_failed)
        if not g.use_dynamic_sampling and not drop_failed:
            metrics.update({**gen_metrics, **failures, **merge_env_metrics(env_parts)})
            return meta, c
        metas.append(meta)
        carries.append(c)
        # All-equal groups carry no signal (DAPO); judged on the raw task reward.
        keep = (dynamic_sampling_keep_mask(c["group"], unshaped) if g.use_dynamic_sampling
                else torch.ones_like(c["env_failed"]))
        keep_masks.append(keep & failed_group_keep_mask(c["group"], c["env_failed"]) if drop_failed else keep)
        dropped = [k for k, kept in zip(meta.sample_ids, keep_masks[-1].tolist()) if not kept]
        if dropped and not fill:  # their columns are never read: free them now
            s.data_plane.clear_samples(dropped, TRAIN_PARTITION)
        try:
            selection = dynamic_sampling_select(keep_masks, target, g.dynamic_sampling_max_gen_batches,
                                                FAILED_GROUPS_HINT if drop_failed else ALL_EQUAL_GROUPS_HINT,
                                                fill=fill)
        except RuntimeError as e:
            s.data_plane.clear_samples(None, TRAIN_PARTITION)
            raise TrainingStopped(str(e).replace("grpo.", f"{cfg.algorithm}.")) from None
        if selection is not None:
            break
    # The last batch's overflow is not trained on: clear it too (with fill, every row not chosen).
    overflow = []
    for m, keep, idx in zip(metas, keep_masks, selection.indices):
        chosen = torch.zeros_like(keep)
        chosen[idx] = True
        still_held = torch.ones_like(keep) if fill else keep
        overflow += [k for k, extra in zip(m.sample_ids, (still_held & ~chosen).tolist()) if extra]
    if overflow:
        s.data_plane.clear_samples(overflow, TRAIN_PARTITION)
    meta = concat_metas([m.subset(idx.tolist()) for m, idx in zip(metas, selection.indices)])
    carry = {k: torch.cat([c[k][idx] for c, idx in zip(carries, selection.indices)]) for k in carries[0]}
    s.prompts.note_trained(torch.unique(carry["group"]).tolist())  # group g = the g-th prompt drawn this step
    metrics.update({**gen_metrics, **failures, **merge_env_metrics(env_parts)})
    metrics["dynamic_sampling_num_gen_batches"] = selection.num_gen_batches
    metrics["dynamic_sampling_num_discarded_valid_samples"] = selection.num_discarded_valid_samples
    if fill:
        metrics["dynamic_sampling_num_filled_samples"] = selection.num_filled_samples
    return meta, carry


def stamp_sample_mask(overlong_filtering: bool, meta: KVBatchMeta,
                      carry: dict[str, torch.Tensor]) -> tuple[KVBatchMeta, torch.Tensor]:
    """The (B,) sample mask (``loss_multiplier``, times not-truncated with ``overlong_filtering``), on the meta."""
    sample_mask = carry["loss_multiplier"].clone()
    if overlong_filtering:
        sample_mask = overlong_filter_sample_mask(sample_mask, carry["truncated"])
    return meta.stamp_tags([{"sample_mask": float(m)} for m in sample_mask.tolist()]), sample_mask


def policy_logprobs(
    s: Session, meta: KVBatchMeta, carry: dict[str, torch.Tensor], sample_mask: torch.Tensor, loss, timer: Timer,
    metrics: dict[str, float],
) -> tuple[KVBatchMeta, torch.Tensor]:
    """Prev and reference logprobs written back by the policy workers (no prev forward when
    ``loss.prev_from_forward``, see ``training/plan.py``), then the logprob-error mask."""
    # A loss given as an object (rlplane.train(loss_fn=...)) may lack these flags: prev is computed, the
    # reference when the loss reads it.
    prev_from_forward = getattr(loss, "prev_from_forward", False)
    reference = getattr(loss, "reference", None)
    if reference is None:
        reference = REFERENCE_LOGPROBS in loss.columns()
    with timer("logprobs"):
        if not prev_from_forward:
            s.policy.get_logprobs_from_meta(meta)
        if reference:
            s.policy.get_reference_policy_logprobs_from_meta(meta)
    if s.cfg.loop.seq_logprob_error_threshold is not None:
        meta, sample_mask = mask_logprob_errors(s, meta, carry, sample_mask, metrics)
    return meta, sample_mask


def mask_logprob_errors(
    s: Session, meta: KVBatchMeta, carry: dict[str, torch.Tensor], sample_mask: torch.Tensor, metrics: dict[str, float]
) -> tuple[KVBatchMeta, torch.Tensor]:
    """``seq_logprob_error_threshold``: drop sequences whose generation and prev logprobs disagree (the one
    place the driver reads per-token columns). Returns the re-stamped receipt and the new (B,) mask."""
    cols = s.data_plane.get_samples(meta, TRAIN_PARTITION, [GENERATION_LOGPROBS, PREV_LOGPROBS, TOKEN_MASK])
    sample_mask, seq_metrics = seq_logprob_error_mask(
        cols[GENERATION_LOGPROBS][:, 1:], cols[PREV_LOGPROBS][:, 1:], cols[TOKEN_MASK][:, 1:].float(),
        sample_mask, s.cfg.loop.seq_logprob_error_threshold, rewards=carry["rewards"],
    )
    metrics.update({k: float(v) for k, v in seq_metrics.items()})
    return meta.stamp_tags([{"sample_mask": float(m)} for m in sample_mask.tolist()]), sample_mask


#: Sequence logprob-error statistics the loss computes each step; with a threshold the driver's are kept.
SEQ_ERROR_STATS = ("max_seq_mult_prob_error", "mean_seq_mult_prob_error", "min_seq_mult_prob_error")


def add_train_metrics(metrics: dict[str, float], train: dict[str, float]) -> None:
    """Add the policy's merged training metrics, keeping the driver's logprob-error statistics if it made them."""
    metrics.update({k: v for k, v in train.items() if k not in SEQ_ERROR_STATS or k not in metrics})


def rollout_metrics(carry: dict[str, torch.Tensor], lengths: list[int]) -> dict[str, float]:
    """Reward and group statistics of the trained samples; ``num_samples`` = prompts × generations."""
    out = {"filtered_reward": float(carry["rewards"].mean()), "num_samples": float(len(carry["rewards"]))}
    # Per prompt group: all responses wrong (no signal), all right (no signal), or mixed.
    groups, inverse = torch.unique(carry["group"], return_inverse=True)
    group_mean = torch.zeros(len(groups)).scatter_add_(0, inverse, carry["rewards"]) / torch.bincount(inverse)
    out["baseline_reward/pct_0"] = float((group_mean == 0).float().mean())
    out["baseline_reward/pct_1"] = float((group_mean == 1).float().mean())
    out["baseline_reward/pct_mixed"] = 1.0 - out["baseline_reward/pct_0"] - out["baseline_reward/pct_1"]
    # Spread within groups (what the advantages are made of): the mean of each group's reward std, and
    # the fraction of groups whose rewards are all equal (any value; no advantage signal).
    dev = (carry["rewards"] - group_mean[inverse]) ** 2
    group_std = (torch.zeros(len(groups)).scatter_add_(0, inverse, dev) / torch.bincount(inverse)).sqrt()
    lo = torch.full((len(groups),), float("inf")).scatter_reduce(0, inverse, carry["rewards"], "amin")
    hi = torch.full((len(groups),), float("-inf")).scatter_reduce(0, inverse, carry["rewards"], "amax")
    out["reward_std_in_group"] = float(group_std.mean())
    out["equal_reward_groups"] = float((lo == hi).float().mean())
    out["truncated_fraction"] = float(carry["truncated"].float().mean())
    out["total_num_tokens"] = float(sum(lengths))
    return out
