"""The async collector steps each environment instance from one thread at a time: batches scored at
once (``max_concurrent_scoring`` > 1) each get instances of their own, and so do the earlier turns of
a multi-turn batch generating while the one before it is scored. An environment then never needs to
be thread-safe."""

from __future__ import annotations

import threading
import time

import pytest

from rlplane.envs import ArithmeticEnv
from rlplane.envs.interface import EnvironmentReturn
from rlplane.workers import environments as environments_module
from tests.unit.async_rl.collector_helpers import P, make_collector, wait_until


class Tracker:
    """Counts the instances made and, per instance and overall, how many steps run at once.
    ``hold`` (a predicate on (instance number, call number)) makes matching steps wait for ``release``."""

    def __init__(self, turns: int = 1, hold=lambda instance, call: False):
        self.turns, self.hold = turns, hold
        self.lock, self.release = threading.Lock(), threading.Event()
        self.instances, self.calls, self.active, self.peak = 0, 0, 0, 0
        self.instance_active: dict[int, int] = {}
        self.instance_peak: dict[int, int] = {}
        self.steps: list[tuple[int, int]] = []  # (instance, turn) of each step, in the order they started

    def make(self, task_name, **kwargs):
        with self.lock:
            self.instances += 1
            number = self.instances
        return TrackedEnv(self, number)


class TrackedEnv(ArithmeticEnv):
    """Exact match; with ``turns`` > 1 the first turns go on (an empty observation: no tokens) and the last
    terminates."""

    def __init__(self, tracker: Tracker, number: int):
        super().__init__()
        self.tracker, self.number = tracker, number

    def step(self, message_logs, metadata):
        t = self.tracker
        turn = 1 + sum(m.get("role") == "environment" for m in message_logs[0])
        with t.lock:
            t.calls += 1
            call = t.calls
            t.steps.append((self.number, turn))
            t.active += 1
            t.peak = max(t.peak, t.active)
            t.instance_active[self.number] = t.instance_active.get(self.number, 0) + 1
            t.instance_peak[self.number] = max(t.instance_peak.get(self.number, 0), t.instance_active[self.number])
        try:
            if t.hold(self.number, call):
                assert t.release.wait(20)
            else:
                time.sleep(0.02)  # long enough for another thread's step to overlap, were it allowed
            if turn < t.turns:
                n = len(message_logs)
                return EnvironmentReturn([{"role": "environment", "content": ""}] * n, list(metadata),
                                         [None] * n, [0.0] * n, [False] * n, None,
                                         {"correct": [0.0] * n, "format": [0.0] * n})
            return super().step(message_logs, metadata)
        finally:
            with t.lock:
                t.active -= 1
                t.instance_active[self.number] -= 1


@pytest.fixture
def tracked(monkeypatch):
    def install(tracker: Tracker) -> Tracker:
        monkeypatch.setattr(environments_module, "create_env", tracker.make)
        return tracker

    return install


def test_batches_scored_at_once_each_step_their_own_environment_instance(tracked):
    # Batch 1's judge call is held; batch 2 is scored meanwhile, on another instance of the environment.
    t = tracked(Tracker(hold=lambda instance, call: call == 1))
    c, _ = make_collector("grpo.async_grpo.max_concurrent_scoring=2")
    try:
        c.start()
        wait_until(lambda: t.calls == 2)
        assert t.peak == 2 and t.instances == 2  # two steps at once, on two instances
        t.release.set()
        wait_until(lambda: len(c.buffer) == 2 * P)
        assert set(t.instance_peak.values()) == {1}  # never one instance from two threads
        assert [g.target_version for g in c.buffer._groups] == [0] * P + [1] * P
    finally:
        t.release.set()
        c.stop()


def test_one_batch_scored_at_a_time_uses_one_instance(tracked):
    # The default: a single-turn environment has one instance, as in sync GRPO.
    t = tracked(Tracker())
    c, _ = make_collector()
    try:
        c.start()
        wait_until(lambda: len(c.buffer) == 2 * P)
        assert t.instances == 1 and t.peak == 1
    finally:
        c.stop()


def test_a_multi_turn_batch_generating_beside_a_scored_one_steps_another_instance(tracked):
    # Two turns. Batch 1's last turn (its scoring) is held; batch 2 generates meanwhile and steps its
    # first turn: on an instance of its own, not the one batch 1 is being scored on.
    t = tracked(Tracker(turns=2, hold=lambda instance, call: call == 2))  # call 2: batch 1's second turn
    c, _ = make_collector("grpo.max_rollout_turns=2")
    try:
        c.start()
        wait_until(lambda: len(t.steps) >= 3 or c.health(), timeout=10)  # batch 1's two turns, batch 2's first
        assert t.steps[:3] == [(1, 1), (2, 2), (1, 1)] and t.peak == 2, (t.steps, c.health(), c.error_traceback())
        t.release.set()
        wait_until(lambda: len(c.buffer) == 2 * P)
        assert set(t.instance_peak.values()) == {1} and t.instances == 2
    finally:
        t.release.set()
        c.stop()


def test_the_collector_scores_as_many_batches_at_once_as_its_age_bound_by_default():
    assert make_collector()[0].options.max_concurrent_scoring == 1
    assert make_collector("grpo.async_grpo.max_trajectory_age_steps=2")[0].options.max_concurrent_scoring == 2
    assert make_collector("grpo.async_grpo.max_trajectory_age_steps=2",
                          "grpo.async_grpo.max_concurrent_scoring=1")[0].options.max_concurrent_scoring == 1
