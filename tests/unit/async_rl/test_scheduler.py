"""The async collector's Schedule as event scripts: no model, no threads, no clock. Each test plays
the events the collector's threads and the trainer send, in one order the threads can produce, and
checks the actions and state that come back."""

from __future__ import annotations

import copy
import random

import pytest

from rlplane.async_rl.buffer import BufferView
from rlplane.async_rl.scheduler import AsyncOptions, Retry, Schedule, StartBatch, Stop
from rlplane.config.loading import load_config

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


# ---- options ---------------------------------------------------------------------------------------------
def test_options_read_the_config_once():
    cfg = load_config(None, ["grpo.async_grpo.enabled=true", "loss_fn.use_importance_sampling_correction=true"])
    o = AsyncOptions.from_config(cfg.grpo)
    g = cfg.grpo
    assert (o.num_prompts_per_step, o.group_size) == (g.num_prompts_per_step, g.num_generations_per_prompt)
    assert (o.max_age_steps, o.max_concurrent_scoring, o.in_flight, o.max_generation_failures) == (1, 1, False, 3)
    assert o.buffer_capacity == o.num_prompts_per_step * 1 * 2 and o.overlap_scoring and o.generating_slot == 1


def test_options_scoring_concurrency_defaults_to_the_age_bound_and_drop_group_stops_the_overlap():
    o = AsyncOptions.from_config(load_config(None, [
        "grpo.async_grpo.enabled=true", "grpo.async_grpo.max_trajectory_age_steps=3",
        "loss_fn.use_importance_sampling_correction=true", "grpo.rollout_failure_policy=drop_group"]).grpo)
    assert o.max_concurrent_scoring == 3 and o.drop_failed_groups and not o.overlap_scoring


# ---- targets ---------------------------------------------------------------------------------------------
def test_nothing_starts_before_start():
    s = Schedule(options(), 0)
    assert s.next_batch(BufferView({}, -1)) is None
    s.start()
    assert s.next_batch(BufferView({}, -1)) == StartBatch(1, 0, P, 0)


def test_one_batch_holds_the_weights_at_a_time():
    w = World()
    assert w.next() == StartBatch(1, 0, P, 0)
    assert w.next() is None  # generating
    w.s.batch_generated(1)
    assert w.next() == StartBatch(2, 1, P, 0)  # the next target while batch 1 is scored


def test_the_weights_serve_their_own_step_and_the_next_max_age():
    w = World(age=2)
    jobs = []
    while (job := w.next()) is not None:
        jobs.append(job)
        w.run(job)
    assert [(j.target, j.version) for j in jobs] == [(0, 0), (1, 0), (2, 0)]
    assert w.next() is None  # every target covered: idle


def test_groups_in_flight_count_as_covered():
    w = World()
    a = w.next()
    w.s.batch_generated(a.number)
    b = w.next()
    w.s.batch_generated(b.number)
    assert (a.target, b.target) == (0, 1) and w.next() is None
    assert w.s.reserved() == 2 * P and w.s.reserved(0) == P


def test_a_partly_covered_target_asks_for_the_rest():
    w = World()
    w.preload(0, 1)
    assert w.next() == StartBatch(1, 0, P - 1, 0)


def test_steps_already_trained_are_not_generated_again():
    w = World(version=3)
    w.last = 3
    assert w.next() == StartBatch(1, 4, P, 3)


def test_a_full_buffer_starts_nothing_groups_in_flight_included():
    w = World(age=2)  # capacity 2 * 2 * 2 = 8
    w.preload(2, 6)
    a = w.next()  # 2 more for step 0: full with the reserved ones
    assert a.needed == P
    w.s.batch_generated(a.number)
    assert w.next() is None
    w.counts[2] -= P  # room: groups left the buffer
    assert w.next() == StartBatch(2, 1, P, 0)


def test_resume_at_a_version_serves_from_it_and_numbers_batches_on():
    w = World(version=4, started=9)
    job = w.next()
    assert job == StartBatch(10, 4, P, 4)
    w.run(job)
    assert w.next() == StartBatch(11, 5, P, 4)


def test_resume_with_restored_groups_generates_only_what_is_missing():
    w = World(version=1)
    w.preload(1, P)  # restored from the checkpoint
    assert w.next() == StartBatch(1, 2, P, 1)


# ---- scoring -------------------------------------------------------------------------------------------------
def test_one_batch_scores_at_a_time_by_default():
    w = World()
    a = w.next()
    w.s.batch_generated(a.number)
    b = w.next()
    w.s.batch_generated(b.number)
    assert w.s.scoring_slot(b.number) is None  # batch 1 is unscored: batch 2 waits, though it asked first
    slot = w.s.scoring_slot(a.number)
    assert slot == 0
    assert w.s.scoring_slot(b.number) is None  # batch 1 still scoring
    w.s.batch_scored(a.number, slot)
    assert w.s.scoring_slot(b.number) == 0  # the slot came back


def test_two_batches_score_at_once_on_their_own_environment_sets():
    w = World(age=2, c=2)
    jobs = []
    for _ in range(3):
        jobs.append(w.next())
        w.s.batch_generated(jobs[-1].number)
    first, second = w.s.scoring_slot(jobs[1].number), w.s.scoring_slot(jobs[0].number)
    assert {first, second} == {0, 1}
    assert w.s.scoring_slot(jobs[2].number) is None  # two unscored batches started before it
    w.s.batch_scored(jobs[1].number, first)  # the later one ends first
    assert w.s.scoring_slot(jobs[2].number) == first


def test_a_batch_with_nothing_to_score_leaves_the_scoring_queue():
    w = World()
    a = w.next()
    w.s.batch_generated(a.number)
    b = w.next()
    w.s.batch_generated(b.number)
    w.s.batch_scored(a.number, None)  # every sample ended before the last turn
    assert w.s.scoring_slot(b.number) == 0 and w.s.free_slots == []


def test_the_generating_set_is_not_a_scoring_one():
    w = World(age=2, c=2)
    a = w.next()
    assert w.s.options.generating_slot == 2 and w.s.free_slots == [0, 1]
    w.s.batch_generated(a.number)
    assert w.s.scoring_slot(a.number) == 0


# ---- start order ---------------------------------------------------------------------------------------------
def test_a_batch_scored_out_of_order_lands_after_the_one_started_before_it():
    w = World(age=2, c=2)
    a = w.next()
    w.s.batch_generated(a.number)
    b = w.next()
    w.s.batch_generated(b.number)
    sa, sb = w.s.scoring_slot(a.number), w.s.scoring_slot(b.number)
    w.s.batch_scored(b.number, sb)
    assert not w.s.may_land(b.number)
    w.s.batch_scored(a.number, sa)
    w.land(a)
    assert w.s.may_land(b.number)
    w.land(b)
    assert w.counts == {0: P, 1: P}


def test_a_failed_generation_lands_at_once():
    w = World()
    a = w.next()
    w.s.batch_generated(a.number)
    b = w.next()  # generating; batch 1 is still being scored
    assert w.s.may_land(b.number)  # its generation raised: the weights wait for it, it leaves first


def test_a_batch_failing_after_its_scoring_passes_its_turn_then_its_target_is_owed_again():
    w = World(age=2, c=2)
    a = w.next()
    w.s.batch_generated(a.number)
    b = w.next()
    w.s.batch_generated(b.number)
    sa, sb = w.s.scoring_slot(a.number), w.s.scoring_slot(b.number)
    w.s.batch_scored(b.number, sb)
    w.s.batch_scored(a.number, sa)
    assert w.s.may_land(a.number)
    assert w.s.batch_failed(a.number, "RuntimeError: lost") == Retry(0.1)
    w.s.batch_finished(a.number)
    w.land(b)
    assert w.next() == StartBatch(3, 0, P, 0)  # target 0 is owed again


def test_without_overlap_everything_lands_at_once():
    w = World(drop=True)
    a = w.next()
    w.s.batch_generated(a.number)
    assert w.s.may_land(a.number)


# ---- drop_group: no overlap --------------------------------------------------------------------------------
def test_drop_group_holds_the_weights_through_the_scoring():
    w = World(drop=True)
    a = w.next()
    w.s.batch_generated(a.number)
    assert not w.s.weights_free() and w.next() is None
    assert w.s.scoring_slot(a.number) == w.s.options.generating_slot  # scored on its generating set, at once
    w.s.batch_scored(a.number, w.s.options.generating_slot)
    assert w.s.free_slots == [0]
    w.land(a)
    assert w.s.weights_free() and w.next().target == 1


def test_drop_group_regenerates_the_dropped_groups_from_the_same_weights():
    w = World(drop=True)
    a = w.next()
    w.s.batch_generated(a.number)
    w.s.batch_scored(a.number, w.s.options.generating_slot)
    w.land(a, groups=P - 1)  # one group dropped
    assert w.next() == StartBatch(2, 0, 1, 0)


def test_drop_group_refit_waits_for_buffered_groups_not_those_in_flight():
    w = World(drop=True)
    a = w.next()
    w.run(a)
    b = w.next()
    w.sample(0)
    assert w.s.refit_must_wait(1, w.view())  # batch 2's groups may yet be dropped
    w.run(b)
    assert not w.s.refit_must_wait(1, w.view())


def test_every_group_dropped_is_a_failed_batch():
    w = World(drop=True, failures=1)
    assert w.s.batch_dropped(1) == Retry(0.0)
    stop = w.s.batch_dropped(1)
    assert isinstance(stop, Stop) and "drop_group" in stop.error and "\n" not in stop.error and w.s.stopped


# ---- refits ----------------------------------------------------------------------------------------------------
def test_refit_requested_while_generating_waits_for_the_generation():
    w = World()
    a = w.next()
    w.s.refit_requested()
    assert not w.s.weights_free()
    w.s.batch_generated(a.number)
    assert w.s.weights_free()
    assert w.next() is None  # no new start while refitting


def test_refit_requested_while_scoring_goes_ahead_and_the_scoring_goes_on():
    w = World()
    a = w.next()
    w.s.batch_generated(a.number)
    slot = w.s.scoring_slot(a.number)
    w.s.refit_requested()
    assert w.s.weights_free()
    w.s.weights_swapped(1)
    w.s.refit_done()
    w.s.batch_scored(a.number, slot)
    w.land(a)
    assert w.versions[0] == [0] * P  # generated by the weights it started with


def test_refit_waits_until_the_outgoing_weights_served_their_steps():
    w = World()
    w.run(w.next())  # step 0
    w.sample(0)
    assert w.s.refit_must_wait(1, w.view())  # step 1 is version 0's
    b = w.next()
    assert b.target == 1
    assert not w.s.refit_must_wait(1, w.view())  # in flight counts as served
    w.s.refit_requested()
    assert not w.s.weights_free()
    w.s.batch_generated(b.number)
    assert w.s.weights_free()


def test_refit_does_not_wait_when_nothing_can_start():
    for stop in ("pause", "stop", "hold"):
        w = World()
        getattr(w.s, stop)()
        assert not w.s.refit_must_wait(0, w.view()), stop


def test_refit_without_next_version_only_waits_for_the_weights():
    w = World()
    assert w.s.weights_free()


def test_a_new_version_serves_the_step_its_age_allows():
    w = World()
    w.run(w.next())
    w.run(w.next())
    w.sample(0)
    w.refit(1)
    assert w.next() == StartBatch(3, 2, P, 1)  # step 1 is covered by version 0


def test_a_refit_before_the_collector_got_to_a_step_leaves_it_to_the_new_weights():
    w = World(age=2)
    w.run(w.next())
    w.s.pause()  # as if the trainer skipped the wait (pause, hold or stop)
    w.sample(0)
    w.refit(1)
    w.s.start()
    assert w.next() == StartBatch(2, 1, P, 1)  # still short: version 1 serves it


# ---- in-flight weight updates -----------------------------------------------------------------------------
def test_in_flight_refit_needs_no_wait():
    w = World(in_flight=True)
    a = w.next()
    assert not w.s.refit_must_wait(1, w.view()) and w.s.weights_free()
    w.s.refit_requested()
    w.s.weights_swapped(1)
    w.s.refit_done()
    assert a.version == 0 and w.next() is None  # still generating: one batch at a time
    w.s.batch_generated(a.number)
    assert w.next().version == 1


# ---- failures ----------------------------------------------------------------------------------------------------
def test_failures_back_off_and_a_success_resets_them():
    w = World(failures=5)
    assert [w.s.batch_failed(1, "E: x").delay_s for _ in range(3)] == pytest.approx([0.1, 0.2, 0.3])
    w.s.batch_succeeded(2)
    assert w.s.batch_failed(3, "E: x") == Retry(0.1)


def test_the_back_off_is_capped_at_a_second():
    w = World(failures=20)
    assert [w.s.batch_failed(1, "E").delay_s for _ in range(12)][-1] == 1.0


def test_too_many_failures_stop_with_one_line():
    w = World(failures=1)
    a = w.next()
    assert isinstance(w.s.batch_failed(a.number, "RuntimeError: device lost"), Retry)
    stop = w.s.batch_failed(a.number, "RuntimeError: device lost")
    assert stop == Stop(w.s.error) and w.s.stopped
    assert w.s.error == ("async collector: generation failed 2 times in a row (grpo.async_grpo.max_generation_failures"
                         " = 1); last error: RuntimeError: device lost")
    w.s.batch_finished(a.number)
    assert w.next() is None


def test_a_failed_batch_gives_its_target_back():
    w = World()
    a = w.next()
    w.s.batch_failed(a.number, "E")
    w.s.batch_finished(a.number)
    assert w.s.reserved() == 0 and w.next() == StartBatch(2, 0, P, 0)


def test_a_deadline_stops_at_once():
    w = World(failures=10)
    stop = w.s.deadline_passed(1, "environment 'x': step past env.step_timeout_s = 5")
    assert stop.error == "async collector: environment 'x': step past env.step_timeout_s = 5" and w.s.stopped


def test_a_crash_stops_and_the_first_error_stays():
    w = World()
    w.s.crashed("KeyError: 'x'")
    w.s.deadline_passed(1, "later")
    assert w.s.error == "async collector stopped: KeyError: 'x'"


# ---- stop, pause, checkpoints -----------------------------------------------------------------------------
def test_stop_mid_batch_starts_nothing_and_the_batch_still_leaves():
    w = World()
    a = w.next()
    w.s.batch_generated(a.number)
    w.s.stop()
    assert w.next() is None and not w.s.settled()
    w.land(a, groups=1)  # stopped while waiting for room: half buffered
    assert w.s.reserved() == 0 and w.s.settled()


def test_pause_settles_once_the_batches_in_flight_leave_and_resume_goes_on():
    w = World()
    a = w.next()
    w.s.pause()
    w.run(a)
    assert w.s.settled() and w.next() is None
    w.s.start()
    assert w.next().target == 1


def test_a_checkpoint_holds_new_starts():
    w = World()
    w.s.hold()
    assert w.next() is None
    w.s.release()
    assert w.next() is not None


def test_reserved_groups_go_down_as_they_are_buffered():
    w = World()
    a = w.next()
    w.s.batch_generated(a.number)
    w.s.batch_scored(a.number, w.s.scoring_slot(a.number))
    w.add(a)
    assert w.s.reserved(0) == P - 1 and w.counts == {0: 1}


# ---- every ordering: a trainer and a collector interleaved at random ---------------------------------------
class Simulation:
    """The trainer (sample, refit) and the collector's threads (loop, one per batch) as steps picked at
    random among those that may run: each seed is one ordering the real threads can produce."""

    def __init__(self, seed, steps=8, start=0, fail_rate=0.0, **kw):
        self.rng, self.w, self.steps = random.Random(seed), World(version=start, failures=10**6, **kw), steps
        self.fail_rate = fail_rate  # the chance that a generating or scoring batch raises (when picked)
        self.step, self.trainer = start, "sample"
        self.batches: dict[int, list] = {}  # number -> [job, phase, slot]

    def moves(self):
        s, w, out = self.w.s, self.w, []
        if self.trainer == "sample" and w.counts.get(self.step, 0) >= s.options.num_prompts_per_step:
            out.append(self.sample)
        if self.trainer == "refit" and not s.refit_must_wait(self.step, w.view()):
            out.append(self.refit_request)
        if self.trainer == "swap" and s.weights_free():
            out.append(self.swap)
        if copy.deepcopy(s).next_batch(w.view()) is not None:  # probed on a copy: starting it is the move
            out.append(self.start_batch)
        for number, (_, phase, _) in self.batches.items():
            if (phase in ("generating", "scoring")
                    or (phase == "queued" and copy.deepcopy(s).scoring_slot(number) is not None)
                    or (phase in ("landing", "failed") and s.may_land(number))):
                out.append(lambda n=number: self.advance(n))
        return out

    def fail(self, number):
        """The batch's generation or scoring raised: counted, it leaves in its turn, its target owed again."""
        s, (_, phase, slot) = self.w.s, self.batches[number]
        if phase == "scoring":
            s.batch_scored(number, slot)
        assert isinstance(s.batch_failed(number, "RuntimeError: lost"), Retry)
        self.batches[number][1:] = ["failed", None]

    def start_batch(self):
        job = self.w.next()
        self.batches[job.number] = [job, "generating", None]

    def advance(self, number):
        s, (job, phase, slot) = self.w.s, self.batches[number]
        if phase in ("generating", "scoring") and self.rng.random() < self.fail_rate:
            return self.fail(number)
        if phase == "failed":
            s.batch_finished(number)
            del self.batches[number]
        elif phase == "generating":
            s.batch_generated(number)
            self.batches[number][1] = "queued"
        elif phase == "queued":
            slot = s.scoring_slot(number)
            assert slot is not None and slot not in [b[2] for b in self.batches.values()]
            self.batches[number][1:] = ["scoring", slot]
        elif phase == "scoring":
            s.batch_scored(number, slot)
            self.batches[number][1:] = ["landing", None]
        else:
            self.w.land(job)
            del self.batches[number]

    def sample(self):
        assert self.w.sample(self.step)
        self.trainer = "refit"

    def refit_request(self):
        self.w.s.refit_requested()
        self.trainer = "swap"

    def swap(self):
        self.step += 1
        self.w.s.weights_swapped(self.step)
        self.w.s.refit_done()
        self.trainer = "sample"

    def run(self):
        start = self.step
        while self.step < start + self.steps:
            moves = self.moves()
            assert moves, f"deadlock at step {self.step}: {self.batches}"
            self.rng.choice(moves)()
        return self.w.trained


@pytest.mark.parametrize("kw", [dict(age=1), dict(age=2), dict(age=2, c=1), dict(age=3, c=2), dict(age=1, c=2),
                                dict(age=2, drop=True), dict(age=2, start=5)], ids=str)
def test_every_ordering_trains_each_step_on_the_weights_its_age_allows(kw):
    # Target t is generated by version t - age (by the start version s for s .. s + age), whatever the
    # timing: the deterministic mode's promise, over 60 random interleavings of the threads' events.
    start, age = kw.get("start", 0), kw["age"]
    for seed in range(60):
        sim = Simulation(seed, **kw)
        trained = sim.run()
        assert [t for t, _ in trained] == list(range(start, start + 8))
        assert sim.w.landed == sorted(sim.w.landed), seed  # in start order, so the prompts replay
        for t, versions in trained:
            assert versions == [max(start, t - age)] * P, (seed, t, versions)


def test_every_ordering_scores_at_most_the_allowed_batches_at_once():
    for seed in range(40):
        sim = Simulation(seed, age=3, c=2)
        real = sim.advance

        def advance(n, sim=sim, real=real):
            real(n)
            assert sum(b[1] == "scoring" for b in sim.batches.values()) <= 2

        sim.advance = advance
        sim.run()


@pytest.mark.parametrize("kw", [dict(age=1), dict(age=2, c=2), dict(age=2, drop=True)], ids=str)
def test_every_ordering_with_failures_still_trains_every_step_within_the_age_bound(kw):
    # A batch that raises is retried, by newer weights if a refit came in between: younger, never older.
    for seed in range(40):
        sim = Simulation(seed, fail_rate=0.2, **kw)
        trained = sim.run()
        assert [t for t, _ in trained] == list(range(8))
        assert all(0 <= t - v <= kw["age"] for t, versions in trained for v in versions), (seed, trained)
        assert sim.w.landed == sorted(sim.w.landed), seed
