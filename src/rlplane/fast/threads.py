"""Thread settings: how many torch threads a worker uses, and a lower priority for background threads.

Thread count order: ``policy.threads_per_worker`` when set; else ``OMP_NUM_THREADS`` (a user's export,
or Ray's per-actor CPU share); else the cores in this process's affinity mask, so that the local
runtime, which runs its workers one after the other in one process, uses every core in each phase.
Set once where a worker is built, never inside a forward. Plain twin: torch's own count and no
nice (``RLPLANE_SET_THREADS=0``; an explicit ``policy.threads_per_worker`` still applies).
"""

from __future__ import annotations

import os
import threading

import torch

from rlplane.fast.switches import SET_THREADS, enabled


def available_cores() -> int:
    """Cores this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def worker_threads(configured: int | None) -> int:
    """The torch thread count for a worker: ``configured`` if given, else ``OMP_NUM_THREADS``, else the cores."""
    if configured is not None:
        return configured
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env)
    return available_cores()


def set_worker_threads(configured: int | None) -> int:
    """``torch.set_num_threads(worker_threads(configured))``; returns the count in force.

    Switched off, only an explicit ``configured`` count is set."""
    if configured is None and not enabled(SET_THREADS):
        return torch.get_num_threads()
    n = worker_threads(configured)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


def lower_thread_priority(increment: int) -> None:
    """Raise the calling thread's nice value by ``increment`` (Linux applies nice per thread, and threads it
    starts inherit it); where that is not possible (not Linux, not permitted) or switched off, nothing changes."""
    if not enabled(SET_THREADS):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + increment)
    except (AttributeError, OSError):
        pass
