"""How many torch threads a worker uses: what the user set, else the cores it may run on.

Order: ``policy.threads_per_worker`` when set; else ``OMP_NUM_THREADS`` when the environment sets it
(a user's export, or Ray, which sets it to each actor's CPU share); else the cores in this
process's affinity mask (``os.sched_getaffinity``: what ``taskset``, cgroups' cpusets or a batch
scheduler left it), which on the 2-core machine is 2. The default used to be 1 thread, which left
one of the two cores idle for the whole default job (the local runtime runs every worker in one
process, one after the other, so each phase can use all the cores).
"""

from __future__ import annotations

import os
import threading

import torch


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
    """``torch.set_num_threads(worker_threads(configured))``; returns the count."""
    n = worker_threads(configured)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


def lower_thread_priority(increment: int) -> None:
    """Raise the calling thread's nice value by ``increment`` (Linux applies nice per thread, and threads it
    starts inherit it); where that is not possible (not Linux, not permitted) it keeps its priority."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + increment)
    except (AttributeError, OSError):
        pass
