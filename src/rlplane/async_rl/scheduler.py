"""The async collector's schedule as plain state: which batch starts next, for which step, by which weights;
when it may score and land; when a refit may swap weights; what a failure leads to.

Pure (no threads, model or clock): the collector calls one method per event under its lock; tests replay
event orders. Rules: ``docs/algorithms.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rlplane.async_rl.buffer import BufferView, buffer_capacity
from rlplane.async_rl.staleness import target_versions

if TYPE_CHECKING:
    from rlplane.config.schema import GRPOConfig


@dataclass(frozen=True)
class AsyncOptions:
    """What the schedule needs of ``grpo`` (and ``async_grpo``), read once (:meth:`from_config`)."""

    num_prompts_per_step: int
    group_size: int
    max_age_steps: int  # grpo.async_grpo.max_trajectory_age_steps
    max_generation_failures: int
    in_flight: bool  # grpo.async_grpo.in_flight_weight_updates
    max_concurrent_scoring: int
    drop_failed_groups: bool  # grpo.rollout_failure_policy == drop_group

    @classmethod
    def from_config(cls, grpo: GRPOConfig) -> AsyncOptions:
        a = grpo.async_grpo
        return cls(grpo.num_prompts_per_step, grpo.num_generations_per_prompt, a.max_trajectory_age_steps,
                   a.max_generation_failures, a.in_flight_weight_updates, a.scoring_concurrency(),
                   grpo.rollout_failure_policy == "drop_group")

    @property
    def overlap_scoring(self) -> bool:
        """The next batch generates while one is scored (not with drop_group, whose regenerations need the
        same weights)."""
        return not self.drop_failed_groups

    @property
    def buffer_capacity(self) -> int:
        return buffer_capacity(self.num_prompts_per_step, self.max_age_steps)

    @property
    def generating_slot(self) -> int:
        """The environment instance set of the generating batch's earlier turns (0.. are the scoring ones)."""
        return self.max_concurrent_scoring


@dataclass(frozen=True)
class StartBatch:
    """Action: generate ``needed`` prompt groups for step ``target`` with weight version ``version``."""

    number: int  # in every key of the batch (group_sample_keys); never repeats in a run
    target: int
    needed: int
    version: int


@dataclass(frozen=True)
class Retry:
    """Action: the batch failed; put its prompts back and pause ``delay_s`` before it leaves."""

    delay_s: float


@dataclass(frozen=True)
class Stop:
    """Action: the collector gives up with ``error`` (one line, kept as :attr:`Schedule.error`)."""

    error: str


@dataclass
class _Batch:
    target: int
    version: int
    unbuffered: int  # groups not in the buffer yet
    generated: bool = False  # its generation is over (after that its results land in start order)
    scored: bool = False  # its scoring is over (or it will never score)


@dataclass
class Schedule:
    """The collector's state between events. ``version``: the generator's weight version."""

    options: AsyncOptions
    version: int
    started: int = 0  # batches started in the run (checkpointed: keys never repeat)
    paused: bool = True  # until start()
    refitting: bool = False
    stopped: bool = False
    error: str | None = None
    failures: int = 0  # failed batches in a row
    holds: int = 0  # checkpoints holding new starts back
    generating: int | None = None  # the batch whose generation holds the weights
    batches: dict[int, _Batch] = field(default_factory=dict)  # in flight, in start order
    free_slots: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.free_slots = list(range(self.options.max_concurrent_scoring))

    # ---- what the counts say
    def reserved(self, target: int | None = None) -> int:
        """Groups of the batches in flight not yet buffered (for ``target``, or all): counted as covered."""
        return sum(b.unbuffered for b in self.batches.values() if target is None or b.target == target)

    def covered(self, target: int, buf: BufferView, in_flight: bool = True) -> int:
        """Groups for ``target`` in the buffer, plus (``in_flight``) those of batches still in flight."""
        return buf.counts.get(target, 0) + (self.reserved(target) if in_flight else 0)

    def next_target(self, buf: BufferView) -> tuple[int, int] | None:
        """(target, groups still needed) of the lowest step the current weights serve that needs groups."""
        for t in target_versions(self.version, self.options.max_age_steps):
            if t <= buf.last_target_sampled:
                continue  # already trained on
            needed = self.options.num_prompts_per_step - self.covered(t, buf)
            if needed > 0:
                return t, needed
        return None

    def settled(self) -> bool:
        """No batch in flight: every drawn prompt is in the buffer, put back, or trained."""
        return not self.batches

    # ---- control: the trainer
    def start(self) -> None:
        self.paused = False

    def pause(self) -> None:
        self.paused = True

    def stop(self) -> None:
        self.stopped = True

    def hold(self) -> None:
        self.holds += 1

    def release(self) -> None:
        self.holds -= 1

    def refit_must_wait(self, next_version: int, buf: BufferView) -> bool:
        """Whether the outgoing weights still owe groups to a step they serve (``next_version .. version + max_age``);
        scoring groups count. Never with in-flight updates, or while nothing can start."""
        o = self.options
        if o.in_flight or self.stopped or self.paused or self.holds:
            return False
        return any(t > buf.last_target_sampled
                   and self.covered(t, buf, in_flight=o.overlap_scoring) < o.num_prompts_per_step
                   for t in range(next_version, self.version + o.max_age_steps + 1))

    def refit_requested(self) -> None:
        """No new batch starts until :meth:`refit_done`."""
        self.refitting = True

    def weights_free(self) -> bool:
        """Whether the weights may be swapped now: no generation uses them (always, with in-flight updates)."""
        return self.options.in_flight or self.generating is None

    def weights_swapped(self, version: int) -> None:
        self.version = version

    def refit_done(self) -> None:
        self.refitting = False

    # ---- the collector's batches
    def next_batch(self, buf: BufferView) -> StartBatch | None:
        """The batch to start now, or None (weights busy, paused, refitting, stopped, buffer full, all served)."""
        if (self.stopped or self.generating is not None or self.paused or self.refitting or self.holds
                or buf.size + self.reserved() >= self.options.buffer_capacity):
            return None
        job = self.next_target(buf)
        return None if job is None else self.start_batch(*job)

    def start_batch(self, target: int, needed: int) -> StartBatch:
        """A batch of ``needed`` groups for ``target`` starts, by the current weights (which it holds)."""
        self.started += 1
        self.generating = self.started
        self.batches[self.started] = _Batch(target, self.version, needed)
        return StartBatch(self.started, target, needed, self.version)

    def batch_generated(self, number: int) -> None:
        """Its generation is over: the weights are free (unless drop_group, where they wait for the scoring)."""
        self.batches[number].generated = True
        if self.options.overlap_scoring and self.generating == number:
            self.generating = None

    def scoring_slot(self, number: int) -> int | None:
        """The environment set the batch may score on now (the first ``max_concurrent_scoring`` unscored batches
        in start order, one set each), or None while it must wait."""
        if not self.options.overlap_scoring:
            return self.options.generating_slot
        unscored = [n for n, b in self.batches.items() if not b.scored]
        if unscored.index(number) >= self.options.max_concurrent_scoring:
            return None
        return self.free_slots.pop(0)

    def batch_scored(self, number: int, slot: int | None) -> None:
        """Its scoring is over (``slot``: the set it held, None if it never scored)."""
        self.batches[number].scored = True
        if slot is not None and self.options.overlap_scoring:
            self.free_slots.append(slot)

    def may_land(self, number: int) -> bool:
        """Whether the batch's results may land: every batch started before it has ended (a failure lands at once)."""
        b = self.batches[number]
        return not (b.generated and self.options.overlap_scoring) or next(iter(self.batches)) == number

    def group_buffered(self, number: int) -> None:
        self.batches[number].unbuffered -= 1

    def batch_succeeded(self, number: int) -> None:
        self.failures = 0

    def batch_failed(self, number: int, reason: str) -> Retry | Stop:
        """Its generation or scoring raised ``reason`` (``Type: message``): retried, or the collector stops."""
        self.failures += 1
        if self.failures > self.options.max_generation_failures:
            return self._stop(f"async collector: generation failed {self.failures} times in a row "
                              f"(grpo.async_grpo.max_generation_failures = {self.options.max_generation_failures}); "
                              f"last error: {reason}")
        return Retry(min(0.1 * self.failures, 1.0))

    def batch_dropped(self, number: int) -> Retry | Stop:
        """Every group of the batch held a failed sample (drop_group): a failed batch toward the limit."""
        self.failures += 1
        if self.failures > self.options.max_generation_failures:
            return self._stop(
                f"async collector: every prompt group of {self.failures} generation batches in a row had a "
                f"sample whose environment failed (grpo.rollout_failure_policy = drop_group, "
                f"grpo.async_grpo.max_generation_failures = {self.options.max_generation_failures}); fix the "
                "environment (see the warnings) or set grpo.rollout_failure_policy=retry or zero_reward")
        return Retry(0.0)

    def deadline_passed(self, number: int, reason: str) -> Stop:
        """A generator or environment hung past its deadline: no retry, the run stops."""
        return self._stop(f"async collector: {reason}")

    def crashed(self, reason: str) -> Stop:
        """An error outside a batch's generation and scoring (a bug): the collector stops."""
        return self._stop(f"async collector stopped: {reason}")

    def batch_finished(self, number: int) -> None:
        """It leaves (buffered, dropped or failed): its unbuffered groups no longer count as covered."""
        del self.batches[number]
        if self.generating == number:
            self.generating = None

    def _stop(self, error: str) -> Stop:
        self.stopped = True
        if self.error is None:
            self.error = error
        return Stop(error)
