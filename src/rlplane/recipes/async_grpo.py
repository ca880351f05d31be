"""Asynchronous GRPO: generation for future steps runs beside training, staleness bounded.

An :class:`~rlplane.async_rl.AsyncTrajectoryCollector` (a thread for ``runtime: local``, a Ray
actor for ``runtime: ray``) generates and scores whole prompt groups with its own copy of the
policy, tagged with the weight version that generated them and the step they are meant for. Each
step here (NeMo RL ``async_grpo_train``, ``reference/nemo_rl_notes.md`` §6.1):

  take the step's groups from the replay buffer (waiting if they are not all there)
  → put them in the data plane → reward scaling/shaping
  → prev logprobs recomputed with the current weights, reference logprobs, advantages, train
    (the shared ``train_on_rollouts``; the loss's IS weight π_old/π_gen corrects the staleness)
  → refit the collector (it finishes the batch in flight first) → weight version + 1.

Timings: ``exposed_generation`` (the trainer waiting for its batch, sampling included),
``idle/buffer_starvation`` (the part of it spent waiting because the batch was incomplete),
``idle/refit_bubble`` (waiting for the collector's batch in flight before a refit) and
``weight_sync`` (copying the weights into the collector). The collector's state (replay buffer,
loader position, prompts drawn but not generated, sampler RNG) is ``replay_buffer.pt`` in each
checkpoint and is restored on resume.
"""

from __future__ import annotations

import time

import torch

from rlplane.async_rl import AsyncTrajectoryCollector, SampleResult, TrajectoryGroup
from rlplane.async_rl.collector import COLUMNS
from rlplane.async_rl.staleness import group_token_ages, token_age_metrics
from rlplane.config.schema import RunConfig
from rlplane.dataplane import KVBatchMeta
from rlplane.recipes.common import TRAIN_PARTITION, Timer, TrainingStopped, run_training, transform_rewards
from rlplane.recipes.grpo import TRAIN_FIELDS, train_on_rollouts
from rlplane.recipes.setup import Session
from rlplane.runtime.groups import WORKER_ENV
from rlplane.workers.rollout import group_keys

CHECKPOINT_FILE = "replay_buffer.pt"
_POLL_S = 0.5  # how long one wait on the buffer lasts before the collector's health is checked


class CollectorHandle:
    """The collector and where it runs: the same calls whether it is a thread here or a Ray actor."""

    def __init__(self, s: Session, start_step: int):
        cfg = s.cfg
        self.remote = cfg.runtime == "ray"
        weights = s.policy.workers[0]
        kwargs = dict(cfg=cfg, loader=s.train_loader, start_version=start_step, seed=cfg.grpo.seed + 3)
        if self.remote:
            import ray

            actor = ray.remote(num_cpus=0.5, max_concurrency=4, runtime_env={"env_vars": WORKER_ENV})(
                AsyncTrajectoryCollector)
            # The weights go from the rank-0 policy actor to the collector; the driver never holds them.
            self.collector = actor.remote(**kwargs, init_weights=weights.get_weights.remote())
        else:
            self.collector = AsyncTrajectoryCollector(**kwargs, init_weights=weights.get_weights())
        self._policy0 = weights
        if s.resumed_from is not None and not (s.resumed_from / CHECKPOINT_FILE).is_file():
            # A synchronous run's checkpoint: the loader position (restored by the session) is all there is.
            s.say(f"{s.resumed_from} has no {CHECKPOINT_FILE} (a sync GRPO checkpoint): starting with an empty buffer")
        elif s.resumed_from is not None:
            state = torch.load(s.resumed_from / CHECKPOINT_FILE, weights_only=True)
            dropped = self.call("load_state_dict", state, start_step)
            s.say(f"restored {len(state['replay_buffer']['groups']) - dropped} trajectory groups "
                  f"({dropped} stale dropped)")
        self.call("start")

    def call(self, method: str, *args, **kwargs):
        if self.remote:
            import ray

            return ray.get(getattr(self.collector, method).remote(*args, **kwargs))
        return getattr(self.collector, method)(*args, **kwargs)

    def refit(self, version: int, timer: Timer) -> None:
        """Collector to the trainer's new weights (version ``version``): wait until the outgoing weights
        have served step ``version`` and for the batch in flight, copy, bump the version."""
        with timer("idle/refit_bubble"):
            self.call("prepare_for_refit", version)
        with timer("weight_sync"):
            w = self._policy0.get_weights.remote() if self.remote else self._policy0.get_weights()
            self.call("update_weights", w)
        self.call("set_weight_version", version)
        self.call("resume_after_refit")

    def stop(self) -> None:
        self.call("stop")
        if self.remote:
            import ray

            ray.kill(self.collector)


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


def put_groups(s: Session, groups: list[TrajectoryGroup]) -> tuple[KVBatchMeta, dict[str, torch.Tensor]]:
    """Write the groups' columns under fresh keys in ``TRAIN_PARTITION``; the receipt and the (B,) carry."""
    G = len(groups[0].columns["input_ids"])
    carry = {k: torch.cat([g.carry[k] for g in groups]) for k in groups[0].carry}  # (B,) each, B = groups × G
    carry["group"] = torch.arange(len(groups)).repeat_interleave(G)
    keys = group_keys(len(groups), G)
    meta = s.data_plane.put_samples(
        keys, TRAIN_PARTITION, {k: [t for g in groups for t in g.columns[k]] for k in COLUMNS},
        tags=[{"sample_mask": float(m)} for m in carry["loss_multiplier"].tolist()],
    )
    return meta, carry


def merge_rollout_metrics(groups: list[TrajectoryGroup]) -> dict[str, float]:
    """The rollout metrics of the step's groups: each group carries its generation batch's values;
    ``max_*`` take the maximum, the rest the mean over groups (the batch's own value when the step's
    groups come from one batch, the usual case)."""
    keys = {k for g in groups for k in g.rollout_metrics}
    out = {}
    for k in sorted(keys):
        vals = [g.rollout_metrics[k] for g in groups if k in g.rollout_metrics]
        out[k] = max(vals) if k.startswith("max_") else sum(vals) / len(vals)
    return out


def async_grpo_step(s: Session, step: int) -> dict[str, float]:
    """One async GRPO step at weight version ``step``; returns its metrics."""
    g = s.cfg.grpo
    handle = s.collector
    if handle is None:  # first step of this process (fresh or resumed): start collecting
        handle = s.collector = CollectorHandle(s, start_step=step)
        s.checkpoint_parts[CHECKPOINT_FILE] = lambda: handle.call("state_dict")
        s.closers.append(handle.stop)
    t_step = time.perf_counter()
    timer = Timer()
    metrics: dict[str, float] = {}

    # ---- the step's trajectories, from the buffer into the data plane ------------------------------
    result = wait_for_groups(s, handle, step, timer)
    s.data_plane.register_partition(TRAIN_PARTITION, TRAIN_FIELDS, g.num_prompts_per_step * g.num_generations_per_prompt)
    meta, carry = put_groups(s, result.groups)
    metrics["reward"] = float(carry["rewards"].mean())  # before scaling and shaping
    _, carry["rewards"] = transform_rewards(s.cfg, carry)
    metrics.update(merge_rollout_metrics(result.groups))
    metrics["avg_trajectory_age"] = result.avg_trajectory_age
    metrics["max_trajectory_age"] = float(result.max_trajectory_age)
    metrics["evicted_trajectory_groups"] = float(result.evicted)
    metrics.update(token_age_metrics(*group_token_ages(result.groups, step), g.async_grpo.max_trajectory_age_steps))

    # ---- logprobs, advantages, train (shared with sync GRPO), then refit ----------------------------
    out = train_on_rollouts(s, meta, carry, timer, metrics)
    handle.refit(step + 1, timer)
    out.update({f"timing/train/{k}": timer.times[k] for k in ("idle/refit_bubble", "weight_sync")})
    out["train/buffer_size"] = float(handle.call("stats")["buffer_size"])
    out["timing/train/total_step_time"] = time.perf_counter() - t_step
    return out


def train(cfg: RunConfig, *, quiet: bool = False) -> dict:
    """Run the whole async job: warm-up (or resume), async GRPO steps, validation, checkpoints."""
    return run_training(cfg, async_grpo_step, quiet=quiet)
