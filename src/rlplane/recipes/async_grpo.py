"""Asynchronous GRPO: generation for future steps runs beside training, staleness bounded.

A collector (thread, child process or Ray actor) generates and scores prompt groups with its own policy
copy into the data plane; its replay buffer holds their receipts. Each step (NeMo RL ``async_grpo_train``):
take the step's receipts → reward scaling/shaping → prev logprobs with the current weights, reference,
advantages, train (the IS weight π_old/π_gen corrects staleness) → clear the step's keys → refit the
collector → version + 1. Timings: ``exposed_generation``, ``idle/buffer_starvation`` (waiting on an
incomplete batch), ``idle/refit_bubble`` (waiting on the generation in flight), ``weight_sync``, and
``timing/collector/{generation,scoring,score_wait}``. The collector's state is ``replay_buffer.pt``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from rlplane.async_rl import AsyncOptions, AsyncTrajectoryCollector, SampleResult, TrajectoryGroup
from rlplane.async_rl.staleness import group_token_ages, token_age_metrics
from rlplane.config.plan import skips_prev_logprob_forward
from rlplane.config.schema import RunConfig
from rlplane.dataplane import concat_metas
from rlplane.dataplane.columns import (
    ADVANTAGES,
    GENERATION_LOGPROBS,
    INPUT_IDS,
    PREV_LOGPROBS,
    REFERENCE_LOGPROBS,
    TOKEN_MASK,
)
from rlplane.envs.registry import env_registry_snapshot, restore_env_registry
from rlplane.runtime.groups import cluster_gpus, make_actor
from rlplane.training import Components, Session, Timer, TrainingStopped
from rlplane.training.advantages import estimator_advantages
from rlplane.training.rollouts import (
    TRAIN_PARTITION,
    add_train_metrics,
    apply_reward_control,
    policy_logprobs,
    rollout_metrics,
    stamp_sample_mask,
    transform_rewards,
)
from rlplane.training.samples import train_samples
from rlplane.training.weight_check import WeightCheck
from rlplane.training.workers import RAY_CPUS_COLLECTOR, collector_gpus
from rlplane.utils.kill_points import kill_point
from rlplane.utils.metrics import merge_rank_metrics
from rlplane.workers.env_metrics import is_env_metric, merge_env_metrics
from rlplane.workers.policy import ClippedPGLoss

CHECKPOINT_FILE = "replay_buffer.pt"
_POLL_S = 0.5  # how long one wait on the buffer lasts before the collector's health is checked
# The step's columns: from the collector, the policy workers (logprobs) and the driver (advantages).
TRAIN_COLUMNS = [INPUT_IDS, TOKEN_MASK, GENERATION_LOGPROBS, PREV_LOGPROBS, REFERENCE_LOGPROBS, ADVANTAGES]


class CollectorHandle:
    """The collector (the runtime decides where), writing into the session's data plane, started with the
    policy's weights and restored from the resumed checkpoint."""

    def __init__(self, s: Session, start_step: int):
        cfg = s.cfg
        policy = s.workers.policy
        self.options = AsyncOptions.from_config(cfg.grpo)
        kwargs = dict(cfg=cfg, loader=s.prompts.loader, start_version=start_step, seed=cfg.grpo.seed + 3,
                      data_plane=s.data_plane, partition_id=TRAIN_PARTITION, fields=TRAIN_COLUMNS,
                      init_weights=policy.lazy("get_weights"),  # straight from the rank-0 policy, not via the driver
                      options=self.options, env_pools=s.workers.env_pools)
        gpus = collector_gpus(cfg, cluster_gpus()) if cfg.runtime == "ray" else 0.0
        # A child process builds its environments from its own registry: send this one's.
        self.actor = make_actor(cfg.runtime, AsyncTrajectoryCollector, kwargs, num_cpus=RAY_CPUS_COLLECTOR,
                                num_gpus=gpus, max_concurrency=4, process=cfg.grpo.async_grpo.collector_process,
                                setup=[(restore_env_registry, (env_registry_snapshot(),))], name="async collector")
        self._policy = policy
        self._prompts = s.prompts
        self._seconds: dict[str, float] = {}  # the collector's time counters at the last refit
        if self.actor.obj is None:  # its own copy of the loader, in its process: checkpoints read its position
            s.prompts.state_from = lambda: self.call("loader_state")
        resumed = s.checkpoints.resumed_from
        if resumed is not None and not (resumed / CHECKPOINT_FILE).is_file():
            # A sync run's checkpoint: the loader position (restored by the session) is all there is.
            s.say(f"{resumed} has no {CHECKPOINT_FILE} (a sync GRPO checkpoint): starting with an empty buffer")
        elif resumed is not None:  # read by the collector itself: its columns never pass the driver
            restored, dropped = self.call("load_state", str(resumed / CHECKPOINT_FILE), start_step)
            s.say(f"restored {restored} trajectory groups ({dropped} stale dropped){self.call('restore_note')}")
        self.check = WeightCheck(cfg.policy.generation, s.say, label="collector generator",
                                 prefix="weight_sync/collector_")
        self._verify(start_step)
        self.call("start")

    def _verify(self, version: int) -> None:
        """The collector's generator holds the weights of ``version`` (:mod:`rlplane.training.weight_check`);
        with in-flight updates a batch may be generating, so no probe then."""
        if self.check.enabled:
            self.check.run(lambda probe, fingerprint: [self.call("weight_report", probe, fingerprint)],
                           self._policy, version, probe=not self.options.in_flight)

    def call(self, method: str, *args, **kwargs):
        return self.actor.call(method, *args, **kwargs)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No collector batch starts meanwhile, and none is in flight (validation's generation runs alone)."""
        self.call("pause")
        try:
            yield
        finally:
            self.call("resume")

    def refit(self, version: int, timer: Timer) -> tuple[int, dict[str, float]]:
        """Collector to the trainer's weights ``version``: wait until the outgoing weights served their steps and
        the generation in flight ended (not with in-flight updates), copy, bump. Returns the groups buffered
        or being scored at the swap and the collector's seconds since the last refit."""
        with timer("idle/refit_bubble"):
            self.call("prepare_for_refit", version)
        kill_point("refit")  # the collector paused, its weights not yet the trainer's (Refit.if_stale is not used)
        stats = self.call("stats")
        buffered = int(stats["buffer_size"])
        seconds = {k.removesuffix("_seconds"): v - self._seconds.get(k, 0.0)
                   for k, v in stats.items() if k.endswith("_seconds")}
        self._seconds = {k: v for k, v in stats.items() if k.endswith("_seconds")}
        with timer("weight_sync"):
            # In a child process: through a mapped shared-memory buffer, not pickled.
            self.call("update_weights", self.actor.share("weights", self._policy.lazy("get_weights")),
                      version)
        self.call("set_weight_version", version)
        self._verify(version)
        self.call("resume_after_refit")
        return buffered, seconds

    def stop(self) -> None:
        remote = self.actor.obj is None  # a Ray actor or a child process: it goes too, its loader position stays
        try:
            self.call("stop")
            if remote:
                self._prompts.load_state_dict(self.call("loader_state"))
        finally:
            if remote:
                self._prompts.state_from = None
                self.actor.close()


def wait_for_groups(s: Session, handle: CollectorHandle, step: int, timer: Timer) -> SampleResult:
    """The step's groups from the buffer; raises ``TrainingStopped`` if the collector gave up."""
    P = s.cfg.grpo.num_prompts_per_step
    with timer("exposed_generation"):
        result = handle.call("sample", P, step, 0.0)
        if result is None:
            with timer("idle/buffer_starvation"):
                while result is None:
                    error = handle.call("health")
                    if error is not None:
                        s.say(handle.call("error_traceback"))
                        raise TrainingStopped(error)
                    result = handle.call("sample", P, step, _POLL_S)
    return result


def step_carry(groups: list[TrajectoryGroup]) -> dict[str, torch.Tensor]:
    """The step's (B,) carry, B = groups × G, group-major; ``group`` numbers the groups 0.. in order."""
    carry = {k: torch.cat([g.carry[k] for g in groups]) for k in groups[0].carry}  # (B,) each
    carry["group"] = torch.arange(len(groups)).repeat_interleave(torch.tensor([len(g.meta) for g in groups]))
    return carry


def merge_rollout_metrics(groups: list[TrajectoryGroup]) -> dict[str, float]:
    """The step's groups' rollout metrics: ``max_*`` the maximum, the rest the mean over groups; ``env/<task>/*``
    merged from each group's own (over exactly the samples the step trains, :func:`merge_env_metrics`)."""
    keys = {k for g in groups for k in g.rollout_metrics if not is_env_metric(k)}
    out = merge_env_metrics([g.rollout_metrics for g in groups])
    for k in sorted(keys):
        vals = [g.rollout_metrics[k] for g in groups if k in g.rollout_metrics]
        out[k] = max(vals) if k.startswith("max_") else sum(vals) / len(vals)
    return out


def async_grpo_step(s: Session, handle: CollectorHandle, loss: ClippedPGLoss, step: int) -> dict[str, float]:
    """One async GRPO step at weight version ``step``; returns its metrics."""
    cfg, g = s.cfg, s.cfg.grpo
    timer = Timer()
    metrics: dict[str, float] = {}

    # ---- the step's trajectories: their receipts from the buffer (the columns are in the data plane)
    result = wait_for_groups(s, handle, step, timer)
    meta, carry = concat_metas([grp.meta for grp in result.groups]), step_carry(result.groups)
    metrics["reward"] = float(carry["rewards"].mean())  # before scaling and shaping; the task's in a control run
    apply_reward_control(g, meta.sample_ids, carry)
    _, carry["rewards"] = transform_rewards(g, cfg.policy.max_total_sequence_length, carry)
    metrics.update(merge_rollout_metrics(result.groups))
    metrics["avg_trajectory_age"] = result.avg_trajectory_age
    metrics["max_trajectory_age"] = float(result.max_trajectory_age)
    metrics["evicted_trajectory_groups"] = float(result.evicted)
    # The step's prompts.jsonl row: what it trains, in order.
    s.prompts.note_served([[grp.epoch, grp.prompt_idx] for grp in result.groups],
                          [*result.evicted_prompts, *result.dropped_prompts])
    metrics.update(token_age_metrics(*group_token_ages(result.groups, step), handle.options.max_age_steps))
    meta, sample_mask = stamp_sample_mask(g.overlong_filtering, meta, carry)

    # ---- prev logprobs with the current weights (IS corrects the staleness), reference logprobs
    meta, sample_mask = policy_logprobs(s, meta, carry, sample_mask, loss, timer, metrics)

    # ---- advantages (grpo.adv_estimator), written back per sample ----------------------------------
    with timer("advantages"):
        rows, adv_metrics = estimator_advantages(s, meta, carry, sample_mask)
    metrics.update(adv_metrics)
    if s.log.train_samples_due():  # logger.log_train_samples_every; per-token advantages shown as their mean
        shown = torch.stack([r.float().mean() if len(r) else torch.zeros(()) for r in rows])  # (B,)
        s.log.add_samples("train", train_samples(s, meta, carry, shown, TRAIN_PARTITION))
    s.data_plane.put_samples(list(meta.sample_ids), TRAIN_PARTITION, {ADVANTAGES: rows})

    # ---- train; the step is over; refit the collector ---------------------------------------------
    with timer("policy_training"):
        results = s.policy.train_from_meta(meta, loss)
    s.refit.mark_stale()
    # This step's keys only: the next steps' groups wait in the same partition.
    s.data_plane.clear_samples(meta, None, wait=False)
    buffered, collector_seconds = handle.refit(step + 1, timer)

    add_train_metrics(metrics, merge_rank_metrics(results))
    metrics.update(rollout_metrics(carry, meta.seq_lens))
    metrics["buffer_size"] = float(buffered)
    return {**{f"train/{k}": v for k, v in metrics.items()}, **timer.metrics(),
            **{f"timing/collector/{k}": v for k, v in collector_seconds.items()}, **handle.check.take_metrics(step)}


def train(cfg: RunConfig, *, quiet: bool = False, components: Components | None = None) -> dict:
    """Run the whole async job: warm-up (or resume), async GRPO steps, validation, checkpoints."""
    with Session(cfg, quiet, components=components) as s:
        loss = s.components.loss_fn or ClippedPGLoss(cfg.loss_fn.options(), reference=s.workers.needs_reference,
                                                     prev_from_forward=skips_prev_logprob_forward(cfg))
        start = s.start()
        handle = CollectorHandle(s, start_step=start)
        s.on_close(handle.stop)
        s.while_validating = handle.paused
        s.checkpoints.add_part(CHECKPOINT_FILE, lambda path: handle.call("save_state", str(path)))
        for step in range(start, s.last_step()):
            s.begin_step(step)
            if s.end_step(step, async_grpo_step(s, handle, loss, step)):
                break
        return s.summary()
