"""lower_thread_priority: the async collector's loop thread yields the CPU to the trainer's step."""

from __future__ import annotations

import os
import threading

from rlplane.utils.threads import lower_thread_priority


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
