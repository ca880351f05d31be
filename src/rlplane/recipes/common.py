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
    ALL_EQUAL_GROUPS_HINT,
    apply_reward_shaping,
    dynamic_sampling_keep_mask,
    dynamic_sampling_select,
    failed_group_keep_mask,
    overlong_filter_sample_mask,
    scale_rewards,
    seq_logprob_error_mask,
)
from rlplane.config.plan import skips_prev_logprob_forward
from rlplane.config.schema import RunConfig
from rlplane.dataplane import KVBatchMeta, concat_metas
from rlplane.recipes.setup import Session, build_session
from rlplane.workers.failures import FAILED_GROUPS_HINT, FAILURE_COUNTS, add_failure_counts

TRAIN_PARTITION = "train"
REWARD_COMPONENT_PREFIX = "reward/"  # carry keys of per-sample reward components (GDPO)


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


def transform_rewards(cfg: RunConfig, carry: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The loop's reward scaling, then its reward shaping, of ``carry["rewards"]``.

    Returns ``(scaled, shaped)``, both (B,): dynamic sampling filters on ``scaled`` (the raw task
    reward, before length-dependent shaping; NeMo RL's ``unshaped_total_reward``), advantages use
    ``shaped``. Reward components (``reward/<name>``, for GDPO) are scaled in place like the total,
    as NeMo RL's ``scale_rewards`` does; shaping applies to the total only.
    """
    g = cfg.loop
    scaling = g.reward_scaling.model_dump()
    for key in [k for k in carry if k.startswith(REWARD_COMPONENT_PREFIX)]:
        carry[key] = scale_rewards(carry[key], **scaling)
    scaled = scale_rewards(carry["rewards"], **scaling)
    shaping = g.reward_shaping.model_dump()
    shaping["max_response_length"] = shaping["max_response_length"] or cfg.policy.max_total_sequence_length
    return scaled, apply_reward_shaping(scaled, carry["response_lengths"], carry["truncated"], **shaping)


class DataExhausted(Exception):
    """The loop's ``max_num_epochs`` passes over the training prompts are used up."""


def batches_available(s: Session) -> int:
    """Generation batches the loader may still give before ``max_num_epochs`` passes are done."""
    loader, g = s.train_loader, s.cfg.loop
    consumed = loader.epoch * len(loader) + loader.batches_done_in_epoch
    return g.max_num_epochs * len(loader) - consumed


def collect_rollouts(
    s: Session, timer: Timer, metrics: dict[str, float]
) -> tuple[KVBatchMeta, dict[str, torch.Tensor]]:
    """Rollouts of one step into ``TRAIN_PARTITION``: reward scaling → shaping → dynamic sampling
    (:func:`dynamic_sampling_keep_mask` on the *unshaped* reward, :func:`dynamic_sampling_select`
    over the generation batches so far; the keys of every sample not selected are cleared). With
    ``rollout_failure_policy: drop_group`` the groups holding a failed sample are dropped and
    refilled the same way (:mod:`rlplane.workers.failures`, which documents the failure metrics).

    Returns the receipt and the (B,) carry (``rewards`` shaped, ``group`` distinct across batches),
    B = ``num_prompts_per_step · num_generations_per_prompt``. Adds ``reward`` (raw, first batch),
    the generation metrics and, with dynamic sampling, ``dynamic_sampling_num_gen_batches`` and
    ``dynamic_sampling_num_discarded_valid_samples`` (samples with reward spread beyond the target,
    cut by the final slice; NeMo RL's meaning). Raises :class:`DataExhausted` when the loader has
    no batch left within ``max_num_epochs`` (the step's samples written so far are cleared).
    """
    cfg, g = s.cfg, s.cfg.loop
    G = g.num_generations_per_prompt
    target = g.num_prompts_per_step * G
    metas, carries, keep_masks, num_groups = [], [], [], 0
    drop_failed = g.rollout_failure_policy == "drop_group"  # failed groups are dropped and refilled too
    failures = dict.fromkeys(FAILURE_COUNTS, 0.0)
    while True:
        if batches_available(s) <= 0:
            s.data_plane.clear_samples(None, TRAIN_PARTITION)  # the step's samples so far: it will not run
            raise DataExhausted(f"{cfg.algorithm}.max_num_epochs = {g.max_num_epochs} passes over the training data done")
        datums = s.next_prompts()
        with timer("generation"):
            meta, c, gen_metrics = s.rollout("rollout", datums, group_size=G, partition_id=TRAIN_PARTITION)
        metrics.setdefault("reward", float(c["rewards"].mean()))  # before scaling and shaping, first batch
        c["group"] = c["group"] + num_groups  # distinct across batches, whatever each batch kept
        num_groups += len(datums)
        unshaped, c["rewards"] = transform_rewards(cfg, c)
        failures = add_failure_counts(failures, gen_metrics, c, drop_failed)
        if not g.use_dynamic_sampling and not drop_failed:
            metrics.update({**gen_metrics, **failures})
            return meta, c
        metas.append(meta)
        carries.append(c)
        # All-equal groups carry no signal (DAPO); judged on the raw task reward, not the shaped one.
        keep = (dynamic_sampling_keep_mask(c["group"], unshaped) if g.use_dynamic_sampling
                else torch.ones_like(c["env_failed"]))
        keep_masks.append(keep & failed_group_keep_mask(c["group"], c["env_failed"]) if drop_failed else keep)
        dropped = [k for k, kept in zip(meta.sample_ids, keep_masks[-1].tolist()) if not kept]
        if dropped:  # their columns are never read: free them now
            s.data_plane.clear_samples(dropped, TRAIN_PARTITION)
        try:
            selection = dynamic_sampling_select(keep_masks, target, g.dynamic_sampling_max_gen_batches,
                                                FAILED_GROUPS_HINT if drop_failed else ALL_EQUAL_GROUPS_HINT)
        except RuntimeError as e:
            s.data_plane.clear_samples(None, TRAIN_PARTITION)
            raise TrainingStopped(str(e).replace("grpo.", f"{cfg.algorithm}.")) from None
        if selection is not None:
            break
    # Kept samples past the target (the last batch's overflow) are not trained on: clear them too.
    overflow = []
    for m, keep, idx in zip(metas, keep_masks, selection.indices):
        chosen = torch.zeros_like(keep)
        chosen[idx] = True
        overflow += [k for k, extra in zip(m.sample_ids, (keep & ~chosen).tolist()) if extra]
    if overflow:
        s.data_plane.clear_samples(overflow, TRAIN_PARTITION)
    meta = concat_metas([m.subset(idx.tolist()) for m, idx in zip(metas, selection.indices)])
    carry = {k: torch.cat([c[k][idx] for c, idx in zip(carries, selection.indices)]) for k in carries[0]}
    metrics.update({**gen_metrics, **failures})
    metrics["dynamic_sampling_num_gen_batches"] = selection.num_gen_batches
    metrics["dynamic_sampling_num_discarded_valid_samples"] = selection.num_discarded_valid_samples
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
        sample_mask = overlong_filter_sample_mask(sample_mask, carry["truncated"])
    meta = meta.stamp_tags([{"sample_mask": float(m)} for m in sample_mask.tolist()])
    with timer("logprobs"):
        if not skips_prev_logprob_forward(cfg):  # else the trainer takes its own forward, detached
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
    """Reward and group statistics of the step's samples (after shaping and sampling);
    ``num_samples`` is how many the step trains on (prompts × generations)."""
    out = {"filtered_reward": float(carry["rewards"].mean()), "num_samples": float(len(carry["rewards"]))}
    # Per prompt group: all responses wrong (no signal), all right (no signal), or mixed.
    groups, inverse = torch.unique(carry["group"], return_inverse=True)
    group_mean = torch.zeros(len(groups)).scatter_add_(0, inverse, carry["rewards"]) / torch.bincount(inverse)
    out["baseline_reward/pct_0"] = float((group_mean == 0).float().mean())
    out["baseline_reward/pct_1"] = float((group_mean == 1).float().mean())
    out["baseline_reward/pct_mixed"] = 1.0 - out["baseline_reward/pct_0"] - out["baseline_reward/pct_1"]
    out["truncated_fraction"] = float(carry["truncated"].float().mean())
    out["total_num_tokens"] = float(sum(lengths))
    return out


def last_step(s: Session) -> int:
    """The step the run ends at: ``max_num_steps``, or sooner when ``max_num_epochs`` passes over the
    prompts run out first (NeMo RL: ``min(max_num_steps, max_num_epochs · batches per epoch)``).

    Without dynamic sampling each step draws exactly one batch, so the bound is known up front; with
    it a step draws a varying number of batches and :func:`collect_rollouts` raises
    :class:`DataExhausted` when the data runs out.
    """
    g = s.cfg.loop
    if g.use_dynamic_sampling:
        return g.max_num_steps
    return min(g.max_num_steps, g.max_num_epochs * len(s.train_loader))


def run_training(cfg: RunConfig, step_fn: Callable[[Session, int], dict[str, float]], *, quiet: bool = False) -> dict:
    """The outer loop of a recipe: warm-up (or resume), ``step_fn`` per step, validation every
    ``val_period`` steps, logging, checkpoints, until :func:`last_step` or the data runs out.
    Returns the run summary."""
    s = build_session(cfg, quiet=quiet)
    g = cfg.loop
    try:
        start = s.resume_or_warm_up()
        if start == 0 and g.val_at_start:
            s.initial_validation = {f"validation/{k}": v for k, v in validate(s).items()}
            s.log(s.initial_validation, step=0)
        last_val = dict(s.initial_validation)
        end = last_step(s)
        done = start
        for step in range(start, end):
            s.rollout("set_weight_version", step)  # samples are seeded by (key, weight version = step)
            try:
                metrics = step_fn(s, step)
            except DataExhausted as e:
                s.say(f"{e}: stopping after step {done}")
                last_val = _finish_early(s, done, last_val)
                break
            done = step + 1
            if (g.val_period and done % g.val_period == 0) or (g.val_at_end and done == end):
                s.refit_if_stale()
                t0 = time.perf_counter()
                last_val = {f"validation/{k}": v for k, v in validate(s).items()}
                metrics.update(last_val)
                metrics["timing/validation/total"] = time.perf_counter() - t0
            s.log(metrics, step=done)
            if s.checkpoint_due(done) or (done == end and cfg.checkpointing.enabled):
                s.save_checkpoint(done, metrics)
        return s.summary(last_val)
    finally:
        s.close()


def _finish_early(s: Session, done: int, last_val: dict) -> dict:
    """The end-of-run validation and checkpoint of step ``done`` when the data ran out during the
    next step (dynamic sampling): the step's own ones did not know it was the last."""
    g, ck = s.cfg.loop, s.cfg.checkpointing
    if done == 0:
        return last_val
    validated = g.val_period and done % g.val_period == 0
    if g.val_at_end and not validated:
        s.refit_if_stale()
        last_val = {f"validation/{k}": v for k, v in validate(s).items()}
        s.log(last_val, step=done)
    if ck.enabled and not s.checkpoint_due(done):
        s.save_checkpoint(done, last_val)
    return last_val
