"""The Schedule's scoring events as scripts: how many batches score at once, on which environment sets,
the order batches land in (start order), and drop_group's no-overlap mode."""

from __future__ import annotations

from rlplane.async_rl.scheduler import Retry, StartBatch, Stop

from .scheduler_world import P, World


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
