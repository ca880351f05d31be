"""Thread settings: a worker's torch thread count (the user's setting, else OMP_NUM_THREADS, else the
cores the process may use), lower_thread_priority for the async collector's loop thread, and their switch."""

from __future__ import annotations

import os
import threading

import torch

from rlplane.config.loading import load_config
from rlplane.fast.switches import SET_THREADS
from rlplane.fast.threads import (
    MIN_THREADED_HIDDEN,
    available_cores,
    lower_thread_priority,
    set_worker_threads,
    worker_threads,
)


def test_default_follows_the_affinity_mask_unless_the_user_sets_it(monkeypatch):
    assert load_config(None, []).policy.threads_per_worker is None  # the default: decided at run time
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 5})  # e.g. taskset -c 0,1,5
    assert available_cores() == 3 and worker_threads(None) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # a user's export, or Ray's per-actor share
    assert worker_threads(None) == 2
    assert worker_threads(4) == 4  # policy.threads_per_worker wins over both


def test_a_narrow_model_runs_one_thread_unless_the_config_says_otherwise(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert MIN_THREADED_HIDDEN == 256
    assert worker_threads(None, 128) == 1 and worker_threads(None, 255) == 1  # the embedded model's width: 1
    assert worker_threads(None, 256) == 4 and worker_threads(None, 576) == 4  # SmolLM2's: OMP_NUM_THREADS
    assert worker_threads(None, None) == 4  # width unknown (a model not loaded yet): as before
    assert worker_threads(3, 128) == 3  # policy.threads_per_worker wins
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert worker_threads(None, 1024) == 4  # the cores


def test_set_worker_threads_sets_torch(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
        assert set_worker_threads(None) == 2 and torch.get_num_threads() == 2
        assert set_worker_threads(1) == 1 and torch.get_num_threads() == 1
        assert set_worker_threads(None, 576) == 2 and torch.get_num_threads() == 2
        assert set_worker_threads(None, 128) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_lower_thread_priority_nices_the_calling_thread_and_the_threads_it_starts():
    main_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen = {}

    def child():
        seen["child"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def worker():
        tid = threading.get_native_id()
        before = os.getpriority(os.PRIO_PROCESS, tid)
        lower_thread_priority(3)
        seen["worker"] = os.getpriority(os.PRIO_PROCESS, tid) - before
        t = threading.Thread(target=child)
        t.start()
        t.join()
        seen["child"] -= before

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    # Nice is capped at 19: the expected step is 3 unless the process already runs near the cap.
    step = min(3, 19 - main_nice)
    assert seen == {"worker": step, "child": step}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main_nice  # this thread untouched



def test_switched_off_leaves_torchs_count_and_priority(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setenv(SET_THREADS, "0")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(before + 1)))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:
        assert set_worker_threads(None) == before == torch.get_num_threads()  # the plain twin: no setting
        assert set_worker_threads(1) == 1 == torch.get_num_threads()  # an explicit policy.threads_per_worker
        nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        lower_thread_priority(3)
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == nice
    finally:
        torch.set_num_threads(before)
