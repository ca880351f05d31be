"""The async collector's Schedule as event scripts: no model, no threads, no clock. Each test plays
the events the collector's threads and the trainer send, in one order the threads can produce, and
checks the actions and state that come back. Here: the options, which targets a batch is started for,
and stop, pause and checkpoints (scoring, refits, failures and random orderings: ``test_scheduler_*.py``)."""

from __future__ import annotations

from rlplane.async_rl.buffer import BufferView
from rlplane.async_rl.scheduler import AsyncOptions, Schedule, StartBatch
from rlplane.config.loading import load_config

from .scheduler_world import P, World, options


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
