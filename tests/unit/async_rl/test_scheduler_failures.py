"""The Schedule's failure events as scripts: back-off and retry, too many failures, deadlines and
crashes (one line, the first error kept)."""

from __future__ import annotations

import pytest

from rlplane.async_rl.scheduler import Retry, StartBatch, Stop

from .scheduler_world import P, World


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
