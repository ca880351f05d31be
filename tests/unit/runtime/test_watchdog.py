"""The watchdog (a call with no progress: stacks dumped, the stuck worker named, the main thread woken)
and the step-boundary stop on SIGINT / SIGTERM / SIGHUP, in this process (no Ray)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading

import pytest
import torch

from rlplane.errors import TrainingInterrupted, WorkerFailed
from rlplane.runtime.groups import LocalActor
from rlplane.runtime.interrupts import StopSignals, stop_message
from rlplane.runtime.watchdog import Watchdog
from rlplane.workers.rollout import check_finite_logprobs


class Stuck:
    def wait_forever(self):
        threading.Event().wait()


def _stuck_call_under_a_watchdog(tmp_path) -> Watchdog:
    """A local call that never returns, under a 0.5 s watchdog: the call ends in KeyboardInterrupt."""
    dog = Watchdog(0.5, "grpo.watchdog_s", tmp_path / "stacks.txt")
    actor = LocalActor(Stuck, {}, name="generator", watchdog=dog)
    dog.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            actor.call(Stuck.wait_forever)
    finally:
        dog.stop()
    return dog


def test_a_stuck_local_call_is_named_and_interrupted(tmp_path):
    dog = _stuck_call_under_a_watchdog(tmp_path)
    assert dog.verdict.startswith("watchdog: no progress for 0.5 s (grpo.watchdog_s = 0.5); stuck: generator "
                                  "(wait_forever, running ")
    assert f"every worker's stack is in {tmp_path / 'stacks.txt'}" in dog.verdict
    stacks = (tmp_path / "stacks.txt").read_text()
    assert stacks.startswith(f"== driver (pid {os.getpid()})") and "in wait_forever" in stacks


def test_a_stuck_call_is_interrupted_where_sigint_was_ignored(tmp_path):
    # A background job of a script (`nohup rlplane train ... &`) starts with SIGINT ignored: the watchdog's
    # wake-up still lands, and the ignore is back once it stops.
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        dog = _stuck_call_under_a_watchdog(tmp_path)
        assert dog.verdict.startswith("watchdog: no progress for 0.5 s")
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, old)


def test_progress_keeps_the_watchdog_quiet(tmp_path):
    dog = Watchdog(0.4, "grpo.watchdog_s", tmp_path / "stacks.txt")
    dog.start()
    try:
        for _ in range(8):
            with dog.tracking("policy rank 0", "train"):
                threading.Event().wait(0.1)
    finally:
        dog.stop()
    assert dog.verdict is None and not (tmp_path / "stacks.txt").exists()


def test_off_starts_no_thread(tmp_path):
    dog = Watchdog(None, "grpo.watchdog_s", tmp_path / "stacks.txt")
    dog.start()
    assert dog._thread is None


def test_first_signal_requests_a_stop_the_second_stops_now():
    with StopSignals().installed() as signals:
        assert signal.getsignal(signal.SIGTERM) == signals.handle
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.requested == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signals.requested is None and signal.getsignal(signal.SIGTERM) != signals.handle


def test_a_runs_signals_are_its_own():
    """Two runs' stop signals share nothing: one installed, the other (not installed) requests nothing."""
    other = StopSignals()
    with StopSignals().installed() as signals:
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.requested == signal.SIGTERM and other.requested is None


def test_sighup_requests_a_stop_and_never_stops_at_once():
    """A closing terminal sends SIGHUP more than once: the repeats keep the stop at the step boundary."""
    old = signal.getsignal(signal.SIGHUP)
    with StopSignals().installed() as signals:
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGHUP)
        assert signals.requested == signal.SIGHUP
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN  # a late one does not kill the teardown
    signal.signal(signal.SIGHUP, old)


def test_processes_started_for_the_run_ignore_sighup():
    """A local Ray's processes share the driver's process group: a closed terminal's SIGHUP is the driver's."""
    with StopSignals().installed() as signals:
        with signals.children_ignore_sighup():
            child = subprocess.Popen(["sleep", "30"])
        assert signal.getsignal(signal.SIGHUP) == signals.handle
    try:
        ignored = next(int(line.split()[1], 16) for line in open(f"/proc/{child.pid}/status")
                       if line.startswith("SigIgn:"))
        assert ignored & (1 << (signal.SIGHUP - 1))
    finally:
        child.kill()
        child.wait()


def test_an_ignored_sighup_stays_ignored():
    """``nohup rlplane train``: the run goes on when the terminal closes."""
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with StopSignals().installed() as signals:
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)
            assert signals.requested is None
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, old)


def test_stop_message_names_the_signal_step_and_checkpoint(tmp_path):
    e = stop_message(signal.SIGINT, 4, tmp_path / "step_4")
    assert isinstance(e, TrainingInterrupted) and e.signum == signal.SIGINT
    assert str(e) == f"stopped by SIGINT after step 4 (checkpoint {tmp_path / 'step_4'}; resume with " \
                     "checkpointing.resume=true)"
    assert "checkpointing is off" in str(stop_message(signal.SIGTERM, 1, None))


def test_non_finite_generation_logprobs_stop_the_run():
    check_finite_logprobs([torch.zeros(3), torch.tensor([-0.5, 0.0])], version=2)
    with pytest.raises(WorkerFailed, match=r"non-finite logprobs in 1 of 2 samples \(first: row 1, weight version 2\)"):
        check_finite_logprobs([torch.zeros(3), torch.tensor([-0.5, float("nan")])], version=2)


def test_the_finite_check_over_all_rows_finds_each_bad_row():
    check_finite_logprobs([], version=0)
    check_finite_logprobs([torch.zeros(0), torch.zeros(2)], version=0)  # a row that generated nothing
    with pytest.raises(WorkerFailed, match=r"in 2 of 4 samples \(first: row 1, weight version 7\)"):
        check_finite_logprobs([torch.zeros(2), torch.tensor([float("-inf")]), torch.zeros(0),
                               torch.tensor([0.0, float("inf")])], version=7)
