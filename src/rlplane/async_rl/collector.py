"""The trajectory collector of async GRPO: generation for future steps beside training.

Owns a generator, the prompt loader and the :class:`ReplayBuffer`, and runs the
:class:`~rlplane.async_rl.scheduler.Schedule` on threads: every decision is the schedule's, this shell
waits and works. Rules: ``docs/algorithms.md``. Runs in a driver thread, a child process, or a Ray actor.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rlplane.async_rl.buffer import ReplayBuffer, SampleResult, TrajectoryGroup, batch_groups
from rlplane.async_rl.scheduler import AsyncOptions, Retry, Schedule, StartBatch, Stop
from rlplane.async_rl.staleness import respan_version_carry, token_versions, version_carry
from rlplane.data.datum import DatumSpec
from rlplane.dataplane import DataPlaneClient, KVBatchMeta, concat_metas
from rlplane.dataplane.columns import ASYNC_ROLLOUT_COLUMNS, GENERATION_VERSIONS, TOKEN_MASK
from rlplane.envs.user import user_exit_message
from rlplane.fast.threads import lower_thread_priority
from rlplane.runtime import helper_threads
from rlplane.runtime.deadlines import DeadlineExceeded
from rlplane.utils.kill_points import kill_point
from rlplane.workers.env_metrics import is_env_metric
from rlplane.workers.environments import EnvBlock
from rlplane.workers.rollout import ENV_GROUPS, RolloutOptions, RolloutWorker


def group_sample_keys(target: int, batch: int | str, datums: Sequence[DatumSpec], group_size: int) -> list[str]:
    """Data-plane keys of a generation batch, group-major: ``t{target}/b{batch}/e{epoch}/p{idx}_g{i}``.

    Unique in a run (the batch counter is checkpointed), so cleared or rewritten keys never meet new ones."""
    return [f"t{target}/b{batch}/e{d.epoch}/p{d.idx}_g{i}" for d in datums for i in range(group_size)]


class AsyncTrajectoryCollector:
    def __init__(
        self,
        rollout: RolloutOptions,
        env: EnvBlock,
        loader: Iterator[list[DatumSpec]],
        start_version: int,
        *,
        seed: int,
        data_plane: DataPlaneClient,
        partition_id: str,
        options: AsyncOptions,
        fields: Sequence[str] = ASYNC_ROLLOUT_COLUMNS,
        init_weights: Mapping[str, torch.Tensor] | None = None,
    ):
        """``rollout``, ``env``: its generator's options and environments (under Ray, the run's actor pools);
        ``options``: the schedule's (``grpo``'s); ``partition_id`` is registered here with ``fields`` (the rollout's
        and the trainer's columns)."""
        self.options = opts = options
        self.schedule = Schedule(opts, start_version)
        self.buffer = ReplayBuffer(opts.buffer_capacity, release=self._clear)
        self.dp, self.partition_id = data_plane, partition_id
        # Registered from this process: under Ray its later puts are ordered after it.
        self.dp.register_partition(partition_id, list(dict.fromkeys([*ASYNC_ROLLOUT_COLUMNS, *fields])),
                                   opts.buffer_capacity * opts.group_size)
        self.worker = RolloutWorker(rollout, env, data_plane, seed=seed)  # its own model copy
        if init_weights is not None:
            self.worker.update_weights(init_weights, version=start_version)
        self.loader = loader
        self._pending: deque[DatumSpec] = deque()  # prompts drawn from the loader and not generated yet
        self._cond = threading.Condition()  # guards the schedule, the pending prompts and the counters
        self._thread: threading.Thread | None = None
        self._batch_threads: list[helper_threads.Call] = []
        self._traceback = ""
        self._restore_note = ""  # what a restore converted (load_state_dict), for the resume line
        # Seconds generating, scoring, and waiting for the previous batch's scoring.
        self.counters = {"groups_generated": 0, "generation_seconds": 0.0, "scoring_seconds": 0.0,
                         "score_wait_seconds": 0.0, "failures": 0, "dropped_groups": 0}

    @property
    def weight_version(self) -> int:
        return self.schedule.version

    def get_weight_version(self) -> int:
        """The generator's weight version (NeMo RL's name)."""
        return self.schedule.version

    # ---- control (called by the trainer)
    def start(self) -> None:
        """Start (or resume) the collection loop."""
        self._event(self.schedule.start)
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="trajectory-collector", daemon=True)
            self._thread.start()

    def pause(self) -> None:
        """No new generation starts; returns once the batches in flight (if any) are in the buffer."""
        with self._cond:
            self.schedule.pause()
            self._cond.wait_for(self.schedule.settled)

    def resume(self) -> None:
        self._event(self.schedule.start)

    def prepare_for_refit(self, next_version: int | None = None) -> None:
        """Stop new generation starts before a weight change; with ``next_version`` first wait until the
        outgoing weights served their steps, then for the generation in flight (not with in-flight updates)."""
        with self._cond:
            if next_version is not None:
                # Polled: the trainer's sampling does not always notify.
                while self.schedule.refit_must_wait(next_version, self.buffer.view()):
                    self._cond.wait(0.02)
            self.schedule.refit_requested()  # only now: the loop must be free to start the batches waited for
            self._cond.wait_for(self.schedule.weights_free)

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        """Load the trainer's weights; with in-flight updates also mid-generation (at its next token)."""
        with self._cond:
            if not self.schedule.weights_free():
                raise RuntimeError("update_weights while a generation batch is in flight; call prepare_for_refit first")
        self.worker.update_weights(state_dict, version=version)

    def set_weight_version(self, version: int) -> None:
        self._event(self.schedule.weights_swapped, version)

    def weight_report(self, probe: bool = True, fingerprint: bool = True):
        """The generator's weight-sync report (:meth:`RolloutWorker.weight_report`), asked before ``start`` or
        between ``update_weights`` and ``resume_after_refit`` (no batch generates then without in-flight updates)."""
        return self.worker.weight_report(probe, fingerprint)

    def resume_after_refit(self) -> None:
        self._event(self.schedule.refit_done)

    def stop(self) -> None:
        self._event(self.schedule.stop)
        if self._thread is not None:
            self._thread.join(timeout=60)
        for thread in list(self._batch_threads):  # a generation cannot be cut short: let it end
            thread.join(timeout=60)

    def health(self) -> str | None:
        """None while healthy; the one-line reason once the collector has given up."""
        with self._cond:
            return self.schedule.error

    def error_traceback(self) -> str:
        """The traceback behind :meth:`health`'s error ("" if none)."""
        with self._cond:
            return self._traceback

    def sample(self, num_groups: int, current_version: int, timeout_s: float | None = 0.0) -> SampleResult | None:
        result = self.buffer.sample(num_groups, current_version, self.options.max_age_steps, timeout_s)
        if result is not None:
            with self._cond:
                self._cond.notify_all()  # room in the buffer: a batch waiting for it goes on
        return result

    def loader_state(self) -> dict[str, Any]:
        """The prompt loader's position."""
        return self.loader.state_dict()

    def stats(self) -> dict[str, float]:
        """Counters; ``buffer_size``: groups buffered or being scored (which of the two depends on timing)."""
        with self._cond:
            return {**self.counters, "buffer_size": len(self.buffer) + self.schedule.reserved()}

    def _event(self, event, *args) -> None:
        """Hand the schedule one event and wake every thread waiting on it."""
        with self._cond:
            event(*args)
            self._cond.notify_all()

    # ---- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Buffer (columns read back), loader position, undrawn prompts, sampler RNG and batch counter, taken
        between batches so every drawn prompt is buffered, pending or trained."""
        with self._cond:
            self.schedule.hold()
            try:
                self._cond.wait_for(self.schedule.settled)
                buffer = self.buffer.state_dict()
                metas = [TrajectoryGroup.from_state(g).meta for g in buffer["groups"]]
                if metas:
                    cols = self.dp.get_samples(concat_metas(metas), None, list(ASYNC_ROLLOUT_COLUMNS))  # (N, T) padded
                    first = 0  # the group's first row in cols
                    for group, meta in zip(buffer["groups"], metas):
                        group["columns"] = {k: [cols[k][first + i, :n].clone() for i, n in enumerate(meta.seq_lens)]
                                            for k in ASYNC_ROLLOUT_COLUMNS}  # G jagged rows each
                        first += len(meta)
                return {
                    "replay_buffer": buffer,
                    "dataloader": self.loader.state_dict(),
                    "pending_prompts": [dataclasses.asdict(d) for d in self._pending],
                    "rng": self.worker.rng_state(),
                    "weight_version": self.schedule.version,
                    "batches": self.schedule.started,
                }
            finally:
                self.schedule.release()
                self._cond.notify_all()

    def load_state_dict(self, state: dict[str, Any], current_version: int) -> int:
        """Restore before :meth:`start`: still-servable groups are written back; returns how many were dropped.

        Groups of another ``num_generations_per_prompt`` go back to be drawn again; version carries of
        another ``max_trajectory_age_steps`` are re-spanned (:meth:`restore_note` says so)."""
        self.loader.load_state_dict(state["dataloader"])
        self._pending = deque(DatumSpec(**d) for d in state["pending_prompts"])
        self.worker.set_rng_state(state["rng"])
        self.schedule.started = int(state.get("batches", 0))
        buffer = self._fit_saved_groups(state["replay_buffer"])
        return self.buffer.load_state_dict(buffer, current_version, self.options.max_age_steps,
                                           restore=self._restore_group)

    def restore_note(self) -> str:
        """What :meth:`load_state_dict` converted, as a clause for the resume line ("" if nothing)."""
        return self._restore_note

    def _fit_saved_groups(self, buffer: dict[str, Any]) -> dict[str, Any]:
        """``buffer`` fitted to this run: other-size groups' prompts are drawn again first (advantages need G);
        version carries are re-spanned."""
        G, span = self.options.group_size, self.options.max_age_steps
        kept, redrawn, respanned, notes = [], [], 0, []
        for g in buffer["groups"]:
            n = len(g["carry"]["loss_multiplier"])
            if n != G:
                redrawn.append((g, n))
                continue
            carry = respan_version_carry(g["carry"], span)
            respanned += carry.keys() != g["carry"].keys()
            kept.append({**g, "carry": carry})
        if redrawn:
            dataset = self.loader.dataset
            self._pending.extendleft(reversed([dataclasses.replace(dataset[int(g["prompt_idx"])],
                                                                   epoch=int(g.get("epoch", 0)))
                                               for g, _ in redrawn]))
            sizes = "/".join(str(n) for n in sorted({n for _, n in redrawn}))
            notes.append(f"{len(redrawn)} groups of {sizes} samples left out, their prompts drawn again at {G} "
                         "(grpo.num_generations_per_prompt changed)")
        if respanned:
            notes.append(f"{respanned} groups' token version counts re-spanned to {span + 1} versions "
                         "(grpo.async_grpo.max_trajectory_age_steps changed)")
        self._restore_note = "".join(f"; {n}" for n in notes)
        return {**buffer, "groups": kept}

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
        # An old checkpoint without per-token versions: every token has the group's.
        v = int(saved["generation_version"])
        if GENERATION_VERSIONS not in cols:
            cols = {**cols, GENERATION_VERSIONS: [torch.where(m > 0, v, -1).long() for m in cols[TOKEN_MASK]]}
        carry.setdefault("oldest_version", torch.full((n,), v, dtype=torch.long))
        if "version_tokens/0" not in carry:
            carry.update({f"version_tokens/{k}": torch.zeros(n, dtype=torch.long) if k else carry["generated_tokens"]
                          for k in range(self.options.max_age_steps + 1)})
        meta = self.dp.put_samples(keys, self.partition_id, {k: cols[k] for k in ASYNC_ROLLOUT_COLUMNS},
                                   tags=[{"sample_mask": float(m)} for m in carry["loss_multiplier"].tolist()])
        return TrajectoryGroup.from_state({**saved, "carry": carry}, meta=meta)

    def _clear(self, metas: list[KVBatchMeta]) -> None:
        """Free the keys of groups that will not be trained (evicted, dropped); nobody waits on it."""
        self.dp.clear_samples(concat_metas(metas), None, wait=False)

    # ---- the threads
    def _loop(self) -> None:
        try:
            lower_thread_priority(NICE_INCREMENT)  # batch threads, started from this one, inherit it
            self._collect()
        except (Exception, SystemExit, KeyboardInterrupt) as e:  # noqa: BLE001 - surfaced through health()
            self._crash(e)

    def _crash(self, e: BaseException) -> None:
        """The collector gives up; a ``sys.exit()`` or ``KeyboardInterrupt`` in a thread can only be the user
        code's (a reward function, an environment): named as theirs, as the synchronous path does."""
        why = user_exit_message(e) if isinstance(e, (SystemExit, KeyboardInterrupt)) else f"{type(e).__name__}: {e}"
        with self._cond:
            self._traceback = traceback.format_exc()
            self.schedule.crashed(why)
            self._cond.notify_all()

    def _collect(self) -> None:
        """Start each batch the schedule asks for, each on a helper thread of its own while it runs."""
        while True:
            with self._cond:
                while (job := self.schedule.next_batch(self.buffer.view())) is None:
                    if self.schedule.stopped:
                        return
                    # Woken by refits, pauses, generations ending and samples; polled besides.
                    self._cond.wait(0.02)
                datums = self._take_prompts(job.needed)
            self._batch_threads = [t for t in self._batch_threads if t.is_alive()]
            self._batch_threads.append(helper_threads.start(functools.partial(self._run_batch, job, datums),
                                                            f"collector-batch-{job.number}"))

    def _take_prompts(self, n: int) -> list[DatumSpec]:
        while len(self._pending) < n:
            self._pending.extend(next(self.loader))
        return [self._pending.popleft() for _ in range(n)]

    def _run_batch(self, job: StartBatch, datums: list[DatumSpec]) -> None:
        try:
            self._generate(job, datums)
        except (Exception, SystemExit, KeyboardInterrupt) as e:  # noqa: BLE001 - surfaced through health()
            self._crash(e)
        finally:
            self._event(self.schedule.batch_finished, job.number)

    def _wait_to_land(self, job: StartBatch) -> None:
        """Until the batches started before ``job`` have ended (its results land in start order)."""
        with self._cond:
            self._cond.wait_for(lambda: self.schedule.may_land(job.number))

    def _generate(self, job: StartBatch, datums: list[DatumSpec]) -> None:
        """Generate, score and buffer one batch, each phase when the schedule lets it."""
        G, w = self.options.group_size, self.worker
        t0 = time.perf_counter()
        times = {"generation": 0.0, "score_wait": 0.0, "scoring": 0.0}
        try:
            # In the generating batch's environment set.
            generated = w.generate(datums, group_size=G, weight_version=job.version,
                                   env_slot=self.options.generating_slot)
            times["generation"] = time.perf_counter() - t0
            self._event(self.schedule.batch_generated, job.number)
            slot = None
            try:
                if generated.needs_scoring:
                    waiting = time.perf_counter()
                    with self._cond:
                        while (slot := self.schedule.scoring_slot(job.number)) is None:
                            self._cond.wait()  # a batch started before this one is scored
                    scoring = time.perf_counter()
                    times["score_wait"] = scoring - waiting
                    w.score(generated, env_slot=slot)
                    times["scoring"] = time.perf_counter() - scoring
            finally:
                self._event(self.schedule.batch_scored, job.number, slot)
            result, carry, rollout_metrics = w.finish(generated, per_group=True)
            versions = token_versions(result.generation_versions, result.token_mask, job.version)
            carry.update(version_carry(versions, result.token_mask, job.version, self.options.max_age_steps))
            meta = w.put(result, carry, self.partition_id, group_sample_keys(job.target, job.number, datums, G),
                         columns={GENERATION_VERSIONS: versions})
        except DeadlineExceeded as e:
            self._wait_to_land(job)  # a hung generator or environment: no retry, the run stops
            with self._cond:
                self._pending.extendleft(reversed(datums))
                self.schedule.deadline_passed(job.number, str(e))
                self._cond.notify_all()
            return
        except Exception as e:  # noqa: BLE001 - any generation error counts toward the limit
            self._wait_to_land(job)
            with self._cond:
                self._pending.extendleft(reversed(datums))  # not lost: the next batch takes them first
                self.counters["failures"] += 1
                action = self.schedule.batch_failed(job.number, f"{type(e).__name__}: {e}")
                if isinstance(action, Stop):
                    self._traceback = traceback.format_exc()
                self._cond.notify_all()
            if isinstance(action, Retry):
                time.sleep(action.delay_s)
            return
        if not self.options.overlap_scoring:  # the scoring is not timed apart
            times = {"generation": time.perf_counter() - t0, "score_wait": 0.0, "scoring": 0.0}
        self._buffer(job, datums, meta, carry, rollout_metrics, times)

    def _buffer(self, job: StartBatch, datums: list[DatumSpec], meta: KVBatchMeta, carry: dict[str, torch.Tensor],
                rollout_metrics: dict[str, float], times: dict[str, float]) -> None:
        """The batch's groups into the buffer in its turn; with drop_group, groups with a failed sample are cleared."""
        G = self.options.group_size
        failed = carry["env_failed"].view(len(datums), G).any(dim=1).tolist() if self.options.drop_failed_groups \
            else [False] * len(datums)
        env_parts = group_env_metrics(rollout_metrics, failed)
        rollout_metrics = {k: float(v) for k, v in {**rollout_metrics, "dropped_groups": sum(failed)}.items()}
        # Made before the turn.
        groups = batch_groups(datums, job.target, meta, carry, rollout_metrics, keep=[not f for f in failed],
                              env_parts=env_parts)
        self._wait_to_land(job)
        with self._cond:
            self.counters["dropped_groups"] += sum(failed)
            # Drawn, never trained: named in the next sampling step's prompts.jsonl row.
            self.buffer.note_dropped([[d.epoch, d.idx] for d, f in zip(datums, failed) if f])
            for k, v in times.items():
                self.counters[f"{k}_seconds"] += v
        if any(failed):
            self._clear([meta.slice(i * G, (i + 1) * G) for i, f in enumerate(failed) if f])
        if all(failed):  # nothing came of the batch: a failure toward the limit, like a generation error
            self._event(self.schedule.batch_dropped, job.number)
            return
        self._event(self.schedule.batch_succeeded, job.number)
        for i, group in enumerate(groups):
            delay = 0.01
            with self._cond:
                while not self.buffer.add(group):  # full: the trainer frees room as it samples
                    if self.schedule.stopped:
                        return
                    self._cond.wait(delay)
                    delay = min(2 * delay, 0.5)
                self.schedule.group_buffered(job.number)
                self.counters["groups_generated"] += 1
            if i == 0:
                kill_point("collector_generation")  # the batch half in the buffer


def group_env_metrics(rollout_metrics: dict, failed: list[bool]) -> list[dict[str, float]]:
    """Each group's own ``env/<task>/*`` metrics, taken out of ``rollout_metrics`` (``finish(per_group=True)``);
    the batch's actor deaths go to its first kept group, so the step that trains it counts them once."""
    parts = [dict(p) for p in rollout_metrics.pop(ENV_GROUPS)]
    deaths = {k: rollout_metrics.pop(k) for k in [k for k in rollout_metrics if is_env_metric(k)]}
    first = next((i for i, f in enumerate(failed) if not f), None)
    if first is not None:
        parts[first].update({k: float(v) for k, v in deaths.items()})
    return parts


# The trainer's step is the critical path, so under ``runtime: local`` the collector thread yields the CPU.
NICE_INCREMENT = 5
