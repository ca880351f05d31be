"""Long-lived helper threads, reused call after call, for work that must run beside its caller (a call under a
deadline, an async batch).

A thread made per call costs its start and leaves native per-thread state behind when it exits (allocator
and math-library buffers: ~0.3 KiB per thread that ran a few matmuls); at a few calls a step that is the
collector's ~2.3 MiB per 1,000 steps. A helper runs one call at a time and then waits for the next; one that
never returns (a hung call) is left behind and a new helper takes the next call. Helpers are kept apart by the
nice of the thread that made them (Linux: per thread, inherited by the threads it starts), so a call runs at
its caller's priority: the async collector's lowered one stays with its batches.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any

IDLE_NAME = "rlplane-helper (idle)"


class Call:
    """One call on a helper: :meth:`join` and :meth:`is_alive` as on a thread, then :meth:`result`."""

    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn
        self.value: Any = None
        self.error: BaseException | None = None
        self._done = threading.Event()

    def join(self, timeout: float | None = None) -> None:
        self._done.wait(timeout)

    def is_alive(self) -> bool:
        return not self._done.is_set()

    def result(self) -> Any:
        """The call's return value, or its exception raised here."""
        if self.error is not None:
            raise self.error
        return self.value


class _Helper:
    def __init__(self, nice: int):
        self.nice = nice
        self.jobs: queue.SimpleQueue[tuple[Call, str]] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name=IDLE_NAME, daemon=True).start()

    def _serve(self) -> None:
        me = threading.current_thread()
        while True:
            call, name = self.jobs.get()
            me.name = name  # what a stack dump shows while it runs
            try:
                call.value = call.fn()
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the call
                call.error = e
            me.name = IDLE_NAME
            call.fn = None  # nothing of the call kept alive by an idle helper
            with _lock:
                _idle.setdefault(self.nice, []).append(self)
            call._done.set()


_lock = threading.Lock()
_idle: dict[int, list[_Helper]] = {}  # by the nice they run at
# A forked child has none of its parent's threads: their helpers would take calls and never run them.
os.register_at_fork(after_in_child=_idle.clear)


def _nice() -> int:
    try:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    except (AttributeError, OSError):
        return 0


def start(fn: Callable[[], Any], name: str) -> Call:
    """Run ``fn()`` on an idle helper at the calling thread's nice (a new one, started from this thread, if none
    is idle), its thread named ``name`` meanwhile."""
    nice = _nice()
    with _lock:
        pool = _idle.get(nice)
        helper = pool.pop() if pool else None
    helper = helper or _Helper(nice)
    call = Call(fn)
    helper.jobs.put((call, name[:60]))
    return call


def idle_count() -> int:
    with _lock:
        return sum(map(len, _idle.values()))
