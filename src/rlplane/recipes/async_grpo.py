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
from pathlib import Path

import torch

from rlplane.async_rl import AsyncOptions, AsyncTrajectoryCollector, SampleResult, TrajectoryGroup
from rlplane.async_rl.staleness import group_token_ages, token_age_metrics
from rlplane.config.schema import GRPOConfig, RunConfig
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
from rlplane.runtime.groups import make_actor
from rlplane.runtime.interrupts import StopSignals
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
from rlplane.utils.kill_points import kill_point
from rlplane.utils.metrics import merge_rank_metrics
from rlplane.workers.env_metrics import is_env_metric, merge_env_metrics
from rlplane.workers.environments import EnvBlock
from rlplane.workers.policy import ClippedPGLoss, PolicyWorker

CHECKPOINT_FILE = "replay_buffer.pt"
_POLL_S = 0.5  # how long one wait on the buffer lasts before the collector's health is checked
# The step's columns: from the collector, the policy workers (logprobs) and the driver (advantages).
TRAIN_COLUMNS = [INPUT_IDS, TOKEN_MASK, GENERATION_LOGPROBS, PREV_LOGPROBS, REFERENCE_LOGPROBS, ADVANTAGES]


class Collector:
    """The collector as the session's side part (:class:`~rlplane.training.session.SidePart`): made before the
    session with nothing running; the session starts it (the runtime decides where: a driver thread, a child
    process, a Ray actor) with the policy's weights once the start step is known, pauses it around validations,
    writes its state into checkpoints (``replay_buffer.pt``, from its own process) and stops it first on close."""

    checkpoint_file = CHECKPOINT_FILE

    def __init__(self, grpo: GRPOConfig):
        self.options = AsyncOptions.from_config(grpo)
        self.in_process = not grpo.async_grpo.collector_process
        self.seed = grpo.seed + 3
        self.actor = None  # started by start()
        self.check: WeightCheck | None = None
        self._policy = self._prompts = None
        self._seconds: dict[str, float] = {}  # the collector's time counters at the last refit

    def start(self, s: Session, start_step: int) -> None:
        """Build the collector writing into the session's data plane, with the rank-0 policy's weights, restored
        from the resumed checkpoint; check its weights; let it generate."""
        plan, policy = s.plan, s.workers.policy
        role = plan.role("collector")
        kwargs = dict(rollout=plan.rollout, env=EnvBlock(s.cfg.env, s.workers.env_pools), loader=s.prompts.loader,
                      start_version=start_step, seed=self.seed, data_plane=s.data_plane,
                      partition_id=TRAIN_PARTITION, fields=TRAIN_COLUMNS,
                      init_weights=policy.lazy(PolicyWorker.get_weights),  # from the rank-0 policy, not the driver
                      options=self.options)
        # A child process builds its environments from its own registry: send this one's.
        self.actor = make_actor(plan.runtime, AsyncTrajectoryCollector, kwargs, num_cpus=role.cpus,
                                num_gpus=role.gpus, max_concurrency=4, process=not self.in_process,
                                setup=[(restore_env_registry, (env_registry_snapshot(),))], name="async collector",
                                watchdog=s.watchdog)
        self._policy, self._prompts = policy, s.prompts
        resumed = s.checkpoints.resumed_from
        if resumed is not None and not (resumed / CHECKPOINT_FILE).is_file():
            # A sync run's checkpoint: the loader position (restored by the session) is all there is.
            s.say(f"{resumed} has no {CHECKPOINT_FILE} (a sync GRPO checkpoint): starting with an empty buffer")
        elif resumed is not None:  # read by the collector itself: its columns never pass the driver
            restored, dropped = self.actor.call(AsyncTrajectoryCollector.load_state, str(resumed / CHECKPOINT_FILE),
                                                start_step)
            note = self.actor.call(AsyncTrajectoryCollector.restore_note)
            s.say(f"restored {restored} trajectory groups ({dropped} stale dropped){note}")
        self.check = WeightCheck(plan.weight_check, s.say, label="collector generator", prefix="weight_sync/collector_")
        self._verify(start_step)
        self.actor.call(AsyncTrajectoryCollector.start)

    def _verify(self, version: int) -> None:
        """The collector's generator holds the weights of ``version`` (:mod:`rlplane.training.weight_check`);
        with in-flight updates a batch may be generating, so no probe then."""
        if self.check.enabled:
            self.check.run(lambda probe, fingerprint: [
                self.actor.call(AsyncTrajectoryCollector.weight_report, probe, fingerprint)],
                self._policy, version, probe=not self.options.in_flight)

    # ---- what the session calls
    @contextmanager
    def paused(self) -> Iterator[None]:
        """No collector batch starts meanwhile, and none is in flight (validation's generation runs alone);
        nothing to pause before it started."""
        if self.actor is None:
            yield
            return
        self.actor.call(AsyncTrajectoryCollector.pause)
        try:
            yield
        finally:
            self.actor.call(AsyncTrajectoryCollector.resume)

    def loader_state(self) -> dict | None:
        """The prompt loader's position while the collector draws in another process (None: the session's loader,
        shared with a thread, or the collector not running)."""
        if self.actor is None or self.actor.obj is not None:
            return None
        return self.actor.call(AsyncTrajectoryCollector.loader_state)

    def save(self, path: Path) -> None:
        self.actor.call(AsyncTrajectoryCollector.save_state, str(path))

    def stop(self) -> None:
        """Stop generating; a collector in another process goes, its loader position kept in the session's loader."""
        if self.actor is None:
            return
        actor, self.actor = self.actor, None
        try:
            actor.call(AsyncTrajectoryCollector.stop)
            if actor.obj is None:
                self._prompts.load_state_dict(actor.call(AsyncTrajectoryCollector.loader_state))
        finally:
            if actor.obj is None:
                actor.close()

    # ---- what the step calls
    def sample(self, num_groups: int, version: int, timeout_s: float) -> SampleResult | None:
        return self.actor.call(AsyncTrajectoryCollector.sample, num_groups, version, timeout_s)

    def health(self) -> str | None:
        return self.actor.call(AsyncTrajectoryCollector.health)

    def error_traceback(self) -> str:
        return self.actor.call(AsyncTrajectoryCollector.error_traceback)

    def refit(self, version: int, timer: Timer) -> tuple[int, dict[str, float]]:
        """Collector to the trainer's weights ``version``: wait until the outgoing weights served their steps and
        the generation in flight ended (not with in-flight updates), copy, bump. Returns the groups buffered
        or being scored at the swap and the collector's seconds since the last refit."""
        c = AsyncTrajectoryCollector
        with timer("idle/refit_bubble"):
            self.actor.call(c.prepare_for_refit, version)
        kill_point("refit")  # the collector paused, its weights not yet the trainer's (Refit.if_stale is not used)
        stats = self.actor.call(c.stats)
        buffered = int(stats["buffer_size"])
        seconds = {k.removesuffix("_seconds"): v - self._seconds.get(k, 0.0)
                   for k, v in stats.items() if k.endswith("_seconds")}
        self._seconds = {k: v for k, v in stats.items() if k.endswith("_seconds")}
        with timer("weight_sync"):
            # In a child process: through a mapped shared-memory buffer, not pickled.
            weights = self.actor.share("weights", self._policy.lazy(PolicyWorker.get_weights))
            self.actor.call(c.update_weights, weights, version)
        self.actor.call(c.set_weight_version, version)
        self._verify(version)
        self.actor.call(c.resume_after_refit)
        return buffered, seconds


def wait_for_groups(s: Session, collector: Collector, step: int, timer: Timer) -> SampleResult:
    """The step's groups from the buffer; raises ``TrainingStopped`` if the collector gave up."""
    P = s.plan.sizes.prompts_per_step
    with timer("exposed_generation"):
        result = collector.sample(P, step, 0.0)
        if result is None:
            with timer("idle/buffer_starvation"):
                while result is None:
                    error = collector.health()
                    if error is not None:
                        s.say(collector.error_traceback())
                        raise TrainingStopped(error)
                    result = collector.sample(P, step, _POLL_S)
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


def async_grpo_step(s: Session, collector: Collector, loss: ClippedPGLoss, step: int) -> dict[str, float]:
    """One async GRPO step at weight version ``step``; returns its metrics."""
    cfg, g = s.cfg, s.cfg.grpo
    timer = Timer()
    metrics: dict[str, float] = {}

    # ---- the step's trajectories: their receipts from the buffer (the columns are in the data plane)
    result = wait_for_groups(s, collector, step, timer)
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
    metrics.update(token_age_metrics(*group_token_ages(result.groups, step), collector.options.max_age_steps))
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
    buffered, collector_seconds = collector.refit(step + 1, timer)

    add_train_metrics(metrics, merge_rank_metrics(results))
    metrics.update(rollout_metrics(carry, meta.seq_lens))
    metrics["buffer_size"] = float(buffered)
    return {**{f"train/{k}": v for k, v in metrics.items()}, **timer.metrics(),
            **{f"timing/collector/{k}": v for k, v in collector_seconds.items()},
            **collector.check.take_metrics(step)}


def train(cfg: RunConfig, *, quiet: bool = False, components: Components | None = None,
          signals: StopSignals | None = None) -> dict:
    """Run the whole async job: warm-up (or resume), async GRPO steps, validation, checkpoints."""
    collector = Collector(cfg.grpo)
    with Session(cfg, quiet, components=components, side=collector, signals=signals) as s:
        loss = s.components.loss_fn or ClippedPGLoss(cfg.loss_fn.options(), reference=s.plan.needs_reference,
                                                     prev_from_forward=s.plan.skips_prev_logprob_forward)
        for step in range(s.start(), s.last_step()):  # start() starts the collector
            s.begin_step(step)
            metrics = async_grpo_step(s, collector, loss, step)
            done = s.trained(step)
            s.validate_if_due(done, metrics)
            s.log_step(done, metrics)
            saved = s.checkpoint_if_due(done, metrics)
            if s.should_stop(done, metrics, saved):
                break
        return s.summary()
