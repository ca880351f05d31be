"""The trajectory collector of async GRPO: generation that runs beside training.

It owns a generator (its own copy of the policy, refit from the trainer's weights), the prompt
loader and the :class:`ReplayBuffer`. Its loop (NeMo RL ``async_utils/trajectory_collector.py``,
``reference/nemo_rl_notes.md`` §6.1):

1. For the generator's weight version ``v`` the servable targets are ``v .. v+max_age``
   (:func:`target_versions`).
2. Reserve the lowest target above the last one the trainer sampled that still needs groups,
   generate ``needed`` whole prompt groups for it, score them, add them to the buffer tagged
   ``(generation_version=v, target_version=t)``.
3. With every target covered (or the buffer full) it idles until the next weight version.

The trainer brackets each refit with :meth:`prepare_for_refit` (no new generation starts; the
batch in flight finishes: the ``hf`` backend cannot swap weights mid-batch) and
:meth:`resume_after_refit`. Failed generation batches are retried, their prompts put back;
after more than ``max_generation_failures`` in a row the collector stops and :meth:`health`
returns the error for the trainer to raise; a call past its deadline (``env.step_timeout_s``,
``policy.generation.timeout_s``: :mod:`rlplane.workers.deadlines`) stops it at once. With
``grpo.rollout_failure_policy: drop_group`` a group holding a failed sample is not buffered
(another is generated in its place); a batch that loses every group counts as a failed batch.

A plain class: ``runtime: local`` runs its loop in a thread of the driver, ``runtime: ray`` wraps
it as a threaded actor (its loop in a thread of the actor, the trainer's calls in others).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from rlplane.async_rl.buffer import ReplayBuffer, SampleResult, TrajectoryGroup, buffer_capacity
from rlplane.config.schema import RunConfig
from rlplane.data.datum import DatumSpec
from rlplane.dataplane import make_data_plane
from rlplane.dataplane.columns import ROLLOUT_COLUMNS
from rlplane.workers.deadlines import DeadlineExceeded
from rlplane.workers.rollout import RolloutWorker

# The rollout worker writes its columns to a private in-process data plane, from which whole groups are cut.
SCRATCH = "collector"
COLUMNS = list(ROLLOUT_COLUMNS)
CARRY = ["rewards", "truncated", "loss_multiplier", "prompt_lengths", "response_lengths"]


def target_versions(generation_version: int, max_age_steps: int) -> list[int]:
    """Training steps a generator at ``generation_version`` may produce for, lowest first:
    ``[v, v+max_age]`` (trained at step ``t`` a group is ``t − v <= max_age`` versions old).

    Step ``v`` itself is normally sampled by the trainer before the generator reaches version ``v``
    and is then skipped; it is served only when still short (the first step of a run or of a
    resume, or a refit that came before the collector got to it). The seeds leave it out after the
    first version and need a start-up barrier instead; serving it cannot deadlock.
    """
    return list(range(generation_version, generation_version + max_age_steps + 1))


class AsyncTrajectoryCollector:
    def __init__(
        self,
        cfg: RunConfig,
        loader: Iterator[list[DatumSpec]],
        start_version: int,
        *,
        seed: int,
        init_weights: Mapping[str, torch.Tensor] | None = None,
    ):
        g = cfg.grpo
        self.num_prompts_per_step = g.num_prompts_per_step
        self.group_size = g.num_generations_per_prompt
        self.max_age_steps = g.async_grpo.max_trajectory_age_steps
        self.max_generation_failures = g.async_grpo.max_generation_failures
        self.buffer = ReplayBuffer(buffer_capacity(self.num_prompts_per_step, self.max_age_steps))
        self._scratch = make_data_plane("memory")
        self.worker = RolloutWorker(cfg, self._scratch, seed=seed)  # its own model copy
        if init_weights is not None:
            self.worker.update_weights(init_weights)
        self.loader = loader
        self._pending: deque[DatumSpec] = deque()  # prompts drawn from the loader and not generated yet
        self.weight_version = start_version
        self._cond = threading.Condition()
        self._paused = True  # until start()
        self._refitting = False
        self._busy = False  # a generation batch is in flight
        self._stop = False
        self._error: str | None = None
        self._failures = 0
        self._hold = 0  # state_dict() calls holding new starts back
        self._traceback = ""
        self._thread: threading.Thread | None = None
        self.counters = {"groups_generated": 0, "generation_seconds": 0.0, "failures": 0, "dropped_groups": 0}
        self.drop_failed_groups = g.rollout_failure_policy == "drop_group"

    # ---- control (called by the trainer) ----------------------------------------------------------
    def start(self) -> None:
        """Start (or resume) the collection loop."""
        with self._cond:
            self._paused = False
            self._cond.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="trajectory-collector", daemon=True)
            self._thread.start()

    def pause(self) -> None:
        """No new generation starts; returns once the batch in flight (if any) is in the buffer."""
        with self._cond:
            self._paused = True
            self._wait_idle()

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def prepare_for_refit(self, next_version: int | None = None) -> None:
        """Stop new generation starts and wait for the batch in flight: the weights are about to change.

        With ``next_version`` (the step the trainer takes after the refit) it first waits until the
        outgoing weights have served that step, when they can: otherwise whether a step is served by
        the old or the new weights would depend on thread timing, and a run would not replay.
        """
        with self._cond:
            if next_version is not None and next_version in target_versions(self.weight_version, self.max_age_steps):
                while not (self._stop or self._error or self._paused or self._hold) \
                        and next_version > self.buffer.last_target_sampled \
                        and self.buffer.count_for_target(next_version) < self.num_prompts_per_step:
                    self._cond.wait(0.02)  # the collector is generating it (or about to)
            self._refitting = True
            self._wait_idle()

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        with self._cond:
            if self._busy:
                raise RuntimeError("update_weights while a generation batch is in flight; call prepare_for_refit first")
        self.worker.update_weights(state_dict)

    def set_weight_version(self, version: int) -> None:
        with self._cond:
            self.weight_version = version
            self._cond.notify_all()

    def resume_after_refit(self) -> None:
        with self._cond:
            self._refitting = False
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def health(self) -> str | None:
        """None while healthy; the one-line reason once the collector has given up."""
        return self._error

    def error_traceback(self) -> str:
        """The traceback behind :meth:`health`'s error ("" if none)."""
        return self._traceback

    def sample(self, num_groups: int, current_version: int, timeout_s: float | None = 0.0) -> SampleResult | None:
        return self.buffer.sample(num_groups, current_version, self.max_age_steps, timeout_s)

    def stats(self) -> dict[str, float]:
        return {**self.counters, "buffer_size": len(self.buffer)}

    # ---- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Buffer, loader position, undrawn prompts and sampler RNG, taken between generation batches:
        every prompt drawn from the loader is then either in the buffer, pending, or already trained."""
        with self._cond:
            self._hold += 1
            try:
                self._wait_idle()
                return {
                    "replay_buffer": self.buffer.state_dict(),
                    "dataloader": self.loader.state_dict(),
                    "pending_prompts": [dataclasses.asdict(d) for d in self._pending],
                    "rng": self.worker.rng_state(),
                    "weight_version": self.weight_version,
                }
            finally:
                self._hold -= 1
                self._cond.notify_all()

    def load_state_dict(self, state: dict[str, Any], current_version: int) -> int:
        """Restore before :meth:`start`; returns how many saved groups were dropped (stale or past)."""
        self.loader.load_state_dict(state["dataloader"])
        self._pending = deque(DatumSpec(**d) for d in state["pending_prompts"])
        self.worker.set_rng_state(state["rng"])
        return self.buffer.load_state_dict(state["replay_buffer"], current_version, self.max_age_steps)

    # ---- the loop ----------------------------------------------------------------------------------
    def _wait_idle(self) -> None:
        while self._busy:
            self._cond.wait()

    def _next_target(self) -> tuple[int, int] | None:
        """(target, groups still needed) of the lowest target that needs generation, or None."""
        for t in target_versions(self.weight_version, self.max_age_steps):
            if t <= self.buffer.last_target_sampled:
                continue  # already trained on
            needed = self.num_prompts_per_step - self.buffer.count_for_target(t)
            if needed > 0:
                return t, needed
        return None

    def _loop(self) -> None:
        try:
            _lower_thread_priority(NICE_INCREMENT)
            self._collect()
        except Exception as e:  # noqa: BLE001 - surfaced to the trainer through health()
            self._traceback = traceback.format_exc()
            self._error = f"async collector stopped: {type(e).__name__}: {e}"
            with self._cond:
                self._stop = True
                self._busy = False
                self._cond.notify_all()

    def _collect(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._stop:
                        return
                    job = None
                    if not (self._paused or self._refitting or self._hold) and not self.buffer.is_full():
                        job = self._next_target()
                    if job is not None:
                        break
                    # Woken by refits and pauses; the buffer draining (trainer's sample) is polled.
                    self._cond.wait(0.02)
                self._busy = True
                version = self.weight_version
            try:
                self._generate(*job, version)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _take_prompts(self, n: int) -> list[DatumSpec]:
        while len(self._pending) < n:
            self._pending.extend(next(self.loader))
        return [self._pending.popleft() for _ in range(n)]

    def _generate(self, target: int, needed: int, version: int) -> None:
        datums = self._take_prompts(needed)
        G = self.group_size
        t0 = time.perf_counter()
        try:
            self._scratch.register_partition(SCRATCH, COLUMNS, len(datums) * G)
            meta, carry, rollout_metrics = self.worker.rollout(datums, group_size=G, partition_id=SCRATCH,
                                                                weight_version=version)
            cols = self._scratch.get_samples(meta, SCRATCH, COLUMNS)  # (B, T) padded
            self._scratch.clear_samples(meta, SCRATCH)
        except DeadlineExceeded as e:  # a hung generator or environment: no retry, the run stops
            self._pending.extendleft(reversed(datums))
            self._error = f"async collector: {e}"
            self._stop = True
            return
        except Exception as e:  # noqa: BLE001 - any generation error counts toward the limit
            self._pending.extendleft(reversed(datums))  # not lost: the retry takes them first
            self._failures += 1
            self.counters["failures"] += 1
            if self._failures > self.max_generation_failures:
                self._traceback = traceback.format_exc()  # before the error: health() readers may then read it
                self._error = (
                    f"async collector: generation failed {self._failures} times in a row "
                    "(grpo.async_grpo.max_generation_failures = "
                    f"{self.max_generation_failures}); last error: {type(e).__name__}: {e}"
                )
                self._stop = True
            else:
                time.sleep(min(0.1 * self._failures, 1.0))
            return
        # rollout_failure_policy: drop_group: a group holding a failed sample is not buffered; the loop
        # generates another for its target from the next prompts.
        failed = carry["env_failed"].view(len(datums), G).any(dim=1).tolist() if self.drop_failed_groups \
            else [False] * len(datums)
        rollout_metrics = {**rollout_metrics, "dropped_groups": float(sum(failed))}
        self.counters["dropped_groups"] += sum(failed)
        if all(failed):  # nothing came of the batch: a failure toward the limit, like a generation error
            self._failures += 1
            if self._failures > self.max_generation_failures:
                self._error = (
                    f"async collector: every prompt group of {self._failures} generation batches in a row had a "
                    f"sample whose environment failed (grpo.rollout_failure_policy = drop_group, "
                    f"grpo.async_grpo.max_generation_failures = {self.max_generation_failures}); fix the environment "
                    "(see the warnings) or set grpo.rollout_failure_policy=retry or zero_reward"
                )
                self._stop = True
            return
        self._failures = 0
        self.counters["generation_seconds"] += time.perf_counter() - t0
        lens = meta.seq_lens
        for i, d in enumerate(datums):
            if failed[i]:
                continue
            rows = range(i * G, (i + 1) * G)
            group = TrajectoryGroup(
                prompt_idx=d.idx,
                generation_version=version,
                target_version=target,
                columns={k: [cols[k][r, : lens[r]].clone() for r in rows] for k in COLUMNS},
                # The fixed carry plus the environment's reward components (reward/<name>, for GDPO).
                carry={k: carry[k][i * G : (i + 1) * G].clone()
                       for k in carry if k in CARRY or k.startswith("reward/")},
                rollout_metrics={k: float(v) for k, v in rollout_metrics.items()},
            )
            delay = 0.01
            while not self.buffer.add(group):  # full: the trainer frees room as it samples
                if self._stop:
                    return
                time.sleep(delay)
                delay = min(2 * delay, 0.5)
            self.counters["groups_generated"] += 1


# The trainer's step is the critical path (generation only has to stay one step ahead), so under
# ``runtime: local`` the collector thread yields the CPU to it. Linux applies nice per thread.
NICE_INCREMENT = 5


def _lower_thread_priority(increment: int) -> None:
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + increment)
    except (AttributeError, OSError):  # not Linux, or not permitted: run at normal priority
        pass
