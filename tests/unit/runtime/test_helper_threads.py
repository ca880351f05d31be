"""Reused helper threads: results and errors reach the caller, a free helper is reused, a hung call is left
behind without holding up the next, a caller's nice is kept, and a forked child starts with no helpers."""

from __future__ import annotations

import os
import threading

import pytest

from rlplane.runtime import helper_threads


def test_value_error_and_name():
    seen = {}

    def named():
        seen["name"] = threading.current_thread().name
        return 7

    call = helper_threads.start(named, "deadline:unit")
    call.join(10)
    assert not call.is_alive() and call.result() == 7 and seen["name"] == "deadline:unit"
    failing = helper_threads.start(lambda: 1 / 0, "x")
    failing.join(10)
    with pytest.raises(ZeroDivisionError):
        failing.result()
    exiting = helper_threads.start(lambda: (_ for _ in ()).throw(SystemExit(3)), "x")
    exiting.join(10)
    with pytest.raises(SystemExit):
        exiting.result()


def test_a_free_helper_is_reused_not_a_new_thread():
    helper_threads.start(lambda: None, "warm").join(10)
    before = threading.active_count()
    idents = set()
    for _ in range(50):
        call = helper_threads.start(lambda: idents.add(threading.get_ident()), "again")
        call.join(10)
        call.result()
    assert threading.active_count() == before
    assert len(idents) == 1  # one helper took every call, one after another


def test_a_hung_call_is_left_behind_and_the_next_runs():
    release = threading.Event()
    hung = helper_threads.start(release.wait, "hung")
    hung.join(0.05)
    assert hung.is_alive()
    nxt = helper_threads.start(lambda: "ran", "next")
    nxt.join(10)
    assert nxt.result() == "ran"
    release.set()
    hung.join(10)
    assert not hung.is_alive()


def test_concurrent_calls_get_helpers_of_their_own():
    barrier = threading.Barrier(4, timeout=10)
    calls = [helper_threads.start(barrier.wait, f"c{i}") for i in range(4)]  # each waits for all four
    for c in calls:
        c.join(10)
        c.result()


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="per-thread nice is Linux's")
def test_a_call_runs_at_its_callers_nice():
    def nice_here():
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def lowered_caller(box):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice_here() + 3)
        call = helper_threads.start(nice_here, "lowered")
        call.join(10)
        box["helper"], box["caller"] = call.result(), nice_here()

    base = nice_here()
    box: dict = {}
    t = threading.Thread(target=lowered_caller, args=(box,))
    t.start()
    t.join(10)
    assert box["helper"] == box["caller"] == base + 3
    plain = helper_threads.start(nice_here, "plain")  # the lowered helper, now idle, is not this caller's
    plain.join(10)
    assert plain.result() == base


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_makes_its_own_helpers():
    helper_threads.start(lambda: None, "parent").join(10)
    assert helper_threads.idle_count() >= 1
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's helpers are not here; a call must still run
        ok = helper_threads.idle_count() == 0
        call = helper_threads.start(lambda: 5, "child")
        call.join(5)
        os.write(w, b"1" if ok and not call.is_alive() and call.result() == 5 else b"0")
        os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.waitpid(pid, 0)
    assert got == b"1"
