"""The trajectory collector of async GRPO: generation that runs beside training.

It owns a generator (its own copy of the policy, refit from the trainer's weights), the prompt
loader and the :class:`ReplayBuffer`. Its loop (NeMo RL ``async_utils/trajectory_collector.py``,
``reference/nemo_rl_notes.md`` §6.1):

1. For the generator's weight version ``v`` the servable targets are ``v .. v+max_age``
   (:func:`target_versions`).
2. Reserve the lowest target above the last one the trainer sampled that still needs groups,
   generate ``needed`` whole prompt groups for it, score them; the rollout worker writes their
   columns into the run's shared data plane under keys unique per group (:func:`group_sample_keys`)
   and the buffer gets their receipts and (G,) carries, tagged
   ``(generation_version=v, target_version=t)``. The trainer reads nothing back through itself:
   its workers read the columns by key. Evicted groups' keys are cleared here.
3. With every target covered (or the buffer full) it idles until the next weight version.

The trainer brackets each refit with :meth:`prepare_for_refit` (no new generation starts; the
batch in flight finishes: the ``hf`` backend cannot swap weights mid-batch) and
:meth:`resume_after_refit`. Failed generation batches are retried, their prompts put back;
after more than ``max_generation_failures`` in a row the collector stops and :meth:`health`
returns the error for the trainer to raise; a call past its deadline (``env.step_timeout_s``,
``policy.generation.timeout_s``: :mod:`rlplane.workers.deadlines`) stops it at once. With
``grpo.rollout_failure_policy: drop_group`` a group holding a failed sample is not buffered
(another is generated in its place); a batch that loses every group counts as a failed batch.

A plain class: ``runtime: local`` runs it in a child process (``grpo.async_grpo.collector_process``:
its data plane client forwards to the driver's in-process plane, columns in shared memory) or its
loop in a thread of the driver (sharing the driver's plane); ``runtime: ray`` wraps it as a
threaded actor (its loop in a thread of the actor, the trainer's calls in others; its client
attaches to the run's Ray store).

Checkpoints: the buffer's groups' columns are read back from the data plane into the checkpoint
file by :meth:`save_state` (here, not on the driver; checkpoints are rare) and written again under
the same keys by :meth:`load_state`, so a resumed run trains exactly the samples a straight run does.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rlplane.async_rl.buffer import ReplayBuffer, SampleResult, TrajectoryGroup, buffer_capacity
from rlplane.config.schema import RunConfig
from rlplane.data.datum import DatumSpec
from rlplane.dataplane import DataPlaneClient, KVBatchMeta, concat_metas
from rlplane.dataplane.columns import ROLLOUT_COLUMNS, TOKEN_MASK
from rlplane.workers.deadlines import DeadlineExceeded
from rlplane.workers.rollout import RolloutWorker

# What a group carries per sample besides the environment's reward/<name> components.
CARRY = ["rewards", "truncated", "loss_multiplier", "prompt_lengths", "response_lengths", "generated_tokens"]


def group_sample_keys(target: int, batch: int | str, datums: Sequence[DatumSpec], group_size: int) -> list[str]:
    """Data-plane keys of a generation batch's samples, group-major:
    ``t{target}/b{batch}/e{epoch}/p{idx}_g{i}``. Unique in a run: a prompt draw (epoch, idx) is
    generated once per batch, and the collector's batch counter never repeats (it is checkpointed);
    so a stale group's cleared keys or a resume's rewritten ones never meet a new sample's."""
    return [f"t{target}/b{batch}/e{d.epoch}/p{d.idx}_g{i}" for d in datums for i in range(group_size)]


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
        data_plane: DataPlaneClient,
        partition_id: str,
        fields: Sequence[str] = ROLLOUT_COLUMNS,
        init_weights: Mapping[str, torch.Tensor] | None = None,
    ):
        """``data_plane``: the run's shared plane; the groups go to ``partition_id``, registered here
        with ``fields`` (the step's columns: the rollout's and those the trainer adds to the same keys)."""
        g = cfg.grpo
        self.num_prompts_per_step = g.num_prompts_per_step
        self.group_size = g.num_generations_per_prompt
        self.max_age_steps = g.async_grpo.max_trajectory_age_steps
        self.max_generation_failures = g.async_grpo.max_generation_failures
        capacity = buffer_capacity(self.num_prompts_per_step, self.max_age_steps)
        self.buffer = ReplayBuffer(capacity, release=self._clear)
        self.dp, self.partition_id = data_plane, partition_id
        # Registered from this process: under Ray its own later puts are then ordered after it.
        self.dp.register_partition(partition_id, [*ROLLOUT_COLUMNS, *fields], capacity * self.group_size)
        self.worker = RolloutWorker(cfg, data_plane, seed=seed)  # its own model copy
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
        self._batches = 0  # generation batches started: part of every key (group_sample_keys)
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

    def loader_state(self) -> dict[str, Any]:
        """The prompt loader's position (the session's ``dataloader.pt`` when this runs in another process)."""
        return self.loader.state_dict()

    def stats(self) -> dict[str, float]:
        return {**self.counters, "buffer_size": len(self.buffer)}

    # ---- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Buffer (its groups' columns read back from the data plane), loader position, undrawn
        prompts, sampler RNG and batch counter, taken between generation batches: every prompt drawn
        from the loader is then either in the buffer, pending, or already trained."""
        with self._cond:
            self._hold += 1
            try:
                self._wait_idle()
                buffer = self.buffer.state_dict()
                metas = [TrajectoryGroup.from_state(g).meta for g in buffer["groups"]]
                if metas:
                    cols = self.dp.get_samples(concat_metas(metas), None, list(ROLLOUT_COLUMNS))  # (N, T) padded
                    first = 0  # the group's first row in cols
                    for group, meta in zip(buffer["groups"], metas):
                        group["columns"] = {k: [cols[k][first + i, :n].clone() for i, n in enumerate(meta.seq_lens)]
                                            for k in ROLLOUT_COLUMNS}  # G jagged rows each
                        first += len(meta)
                return {
                    "replay_buffer": buffer,
                    "dataloader": self.loader.state_dict(),
                    "pending_prompts": [dataclasses.asdict(d) for d in self._pending],
                    "rng": self.worker.rng_state(),
                    "weight_version": self.weight_version,
                    "batches": self._batches,
                }
            finally:
                self._hold -= 1
                self._cond.notify_all()

    def load_state_dict(self, state: dict[str, Any], current_version: int) -> int:
        """Restore before :meth:`start`: the groups still servable at ``current_version`` are written
        back into the data plane; returns how many saved groups were dropped (stale or past)."""
        self.loader.load_state_dict(state["dataloader"])
        self._pending = deque(DatumSpec(**d) for d in state["pending_prompts"])
        self.worker.set_rng_state(state["rng"])
        self._batches = int(state.get("batches", 0))
        return self.buffer.load_state_dict(state["replay_buffer"], current_version, self.max_age_steps,
                                           restore=self._restore_group)

    def save_state(self, path: str) -> None:
        """:meth:`state_dict` written to ``path`` from this process (the driver never holds the columns)."""
        torch.save(self.state_dict(), Path(path))

    def load_state(self, path: str, current_version: int) -> tuple[int, int]:
        """:meth:`load_state_dict` of the file at ``path``; returns (groups restored, groups dropped)."""
        dropped = self.load_state_dict(torch.load(Path(path), weights_only=True), current_version)
        return len(self.buffer), dropped

    def _restore_group(self, saved: dict[str, Any]) -> TrajectoryGroup:
        """A saved group, its columns written again under its keys (minted for a file without them)."""
        cols = saved["columns"]
        n = len(cols[TOKEN_MASK])
        keys = saved.get("keys") or [f"t{saved['target_version']}/restored/p{saved['prompt_idx']}_g{i}"
                                     for i in range(n)]
        carry = dict(saved["carry"])
        carry.setdefault("generated_tokens", torch.tensor([int(m.sum()) for m in cols[TOKEN_MASK]]))
        meta = self.dp.put_samples(keys, self.partition_id, {k: cols[k] for k in ROLLOUT_COLUMNS},
                                   tags=[{"sample_mask": float(m)} for m in carry["loss_multiplier"].tolist()])
        return TrajectoryGroup.from_state({**saved, "carry": carry}, meta=meta)

    def _clear(self, metas: list[KVBatchMeta]) -> None:
        """Free the keys of groups that will not be trained (evicted, dropped); nobody waits on it."""
        self.dp.clear_samples(concat_metas(metas), None, wait=False)

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
        self._batches += 1
        try:
            meta, carry, rollout_metrics = self.worker.rollout(
                datums, group_size=G, partition_id=self.partition_id, weight_version=version,
                keys=group_sample_keys(target, self._batches, datums, G))
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
        # rollout_failure_policy: drop_group: a group holding a failed sample is not buffered (its keys
        # are cleared); the loop generates another for its target from the next prompts.
        failed = carry["env_failed"].view(len(datums), G).any(dim=1).tolist() if self.drop_failed_groups \
            else [False] * len(datums)
        rollout_metrics = {**rollout_metrics, "dropped_groups": float(sum(failed))}
        self.counters["dropped_groups"] += sum(failed)
        if any(failed):
            self._clear([meta.slice(i * G, (i + 1) * G) for i, f in enumerate(failed) if f])
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
        for i, d in enumerate(datums):
            if failed[i]:
                continue
            rows = slice(i * G, (i + 1) * G)
            group = TrajectoryGroup(
                prompt_idx=d.idx,
                generation_version=version,
                target_version=target,
                meta=meta.slice(rows.start, rows.stop),  # its columns stay in the data plane
                # The fixed carry plus the environment's reward components (reward/<name>, for GDPO).
                carry={k: carry[k][rows].clone() for k in carry if k in CARRY or k.startswith("reward/")},
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
