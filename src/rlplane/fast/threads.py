"""Thread settings: torch threads per worker and a lower priority for background threads.

Count: ``policy.threads_per_worker``; else one thread for a model narrower than :data:`MIN_THREADED_HIDDEN` (each
op's work is too small to split: handing half of it to a second thread and waiting for it costs more than it
saves); else ``OMP_NUM_THREADS``, else the cores in the affinity mask. Set once where a worker is built, from the
model's width, never from a timing. Plain twin: torch's own count, no nice (``RLPLANE_SET_THREADS=0``).
"""

from __future__ import annotations

import os
import threading

import torch

from rlplane.fast.switches import SET_THREADS, enabled

# Below this hidden size a worker runs one torch thread unless told otherwise (the embedded 128-wide model:
# docs/benchmarks.md, "Threads"). The same width below which policy.precision: auto keeps fp32.
MIN_THREADED_HIDDEN = 256


def available_cores() -> int:
    """Cores this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def worker_threads(configured: int | None, hidden_size: int | None = None) -> int:
    """The torch thread count for a worker: ``configured`` if given, else 1 for a model of ``hidden_size`` under
    :data:`MIN_THREADED_HIDDEN`, else ``OMP_NUM_THREADS``, else the cores."""
    if configured is not None:
        return configured
    if hidden_size is not None and hidden_size < MIN_THREADED_HIDDEN:
        return 1
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env)
    return available_cores()


def set_worker_threads(configured: int | None, hidden_size: int | None = None) -> int:
    """``torch.set_num_threads(worker_threads(configured, hidden_size))``, returning the count (off: only an
    explicit count)."""
    if configured is None and not enabled(SET_THREADS):
        return torch.get_num_threads()
    n = worker_threads(configured, hidden_size)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


def lower_thread_priority(increment: int) -> None:
    """Raise the calling thread's nice by ``increment`` (per thread on Linux, inherited); else nothing changes."""
    if not enabled(SET_THREADS):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + increment)
    except (AttributeError, OSError):
        pass
