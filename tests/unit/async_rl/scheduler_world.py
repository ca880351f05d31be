"""The async collector's Schedule driven as the collector drives it, for the event-script tests
(``test_scheduler*.py``): no model, no threads, no clock."""

from __future__ import annotations

from rlplane.async_rl.buffer import BufferView
from rlplane.async_rl.scheduler import AsyncOptions, Schedule, StartBatch

P = 2


def options(age=1, c=None, in_flight=False, drop=False, failures=3, P=P) -> AsyncOptions:
    return AsyncOptions(num_prompts_per_step=P, group_size=4, max_age_steps=age, max_generation_failures=failures,
                        in_flight=in_flight, max_concurrent_scoring=c or age, drop_failed_groups=drop)


class World:
    """A schedule and the replay buffer it reads (groups per target), driven as the collector drives it."""

    def __init__(self, version=0, started=0, **kw):
        self.s = Schedule(options(**kw), version)
        self.s.started = started
        self.s.start()
        self.counts: dict[int, int] = {}
        self.last = -1
        self.trained: list[tuple[int, list[int]]] = []  # (step, versions of its groups)
        self.versions: dict[int, list[int]] = {}  # target -> versions of its buffered groups
        self.landed: list[int] = []  # batch numbers, in the order their groups entered the buffer

    def preload(self, target: int, n: int, version: int = 0) -> None:
        """``n`` groups for ``target`` already in the buffer (restored, or generated earlier)."""
        self.counts[target] = self.counts.get(target, 0) + n
        self.versions.setdefault(target, []).extend([version] * n)

    def view(self) -> BufferView:
        return BufferView(dict(self.counts), self.last)

    def next(self) -> StartBatch | None:
        return self.s.next_batch(self.view())

    def add(self, job: StartBatch) -> bool:
        if sum(self.counts.values()) >= self.s.options.buffer_capacity:
            return False
        self.counts[job.target] = self.counts.get(job.target, 0) + 1
        self.versions.setdefault(job.target, []).append(job.version)
        self.s.group_buffered(job.number)
        return True

    def land(self, job: StartBatch, groups: int | None = None) -> None:
        assert self.s.may_land(job.number)
        self.s.batch_succeeded(job.number)
        self.landed.append(job.number)
        for _ in range(job.needed if groups is None else groups):
            assert self.add(job)
        self.s.batch_finished(job.number)

    def run(self, job: StartBatch) -> None:
        """A batch's whole life, alone: generated, scored, buffered."""
        self.s.batch_generated(job.number)
        slot = self.s.scoring_slot(job.number)
        assert slot is not None
        self.s.batch_scored(job.number, slot)
        self.land(job)

    def sample(self, step: int) -> bool:
        """The trainer takes step ``step``'s groups (the buffer evicts the steps before it), if all are there."""
        if self.counts.get(step, 0) < self.s.options.num_prompts_per_step:
            return False
        P = self.s.options.num_prompts_per_step
        self.trained.append((step, self.versions[step][:P]))
        self.versions[step] = self.versions[step][P:]
        self.counts[step] -= P
        for t in [t for t in self.counts if t < step or not self.counts[t]]:  # evicted: their step passed
            del self.counts[t]
        self.last = max(self.last, step)
        return True

    def refit(self, version: int) -> None:
        """A refit with nothing owed and nothing generating."""
        assert not self.s.refit_must_wait(version, self.view())
        self.s.refit_requested()
        assert self.s.weights_free()
        self.s.weights_swapped(version)
        self.s.refit_done()
