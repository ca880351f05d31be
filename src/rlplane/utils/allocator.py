"""Keep freed memory in the process: glibc's ``mallopt`` so that decode steps stop paying page faults.

A decode step allocates and frees the same large CPU tensors every time (the (B, V) logits, their
log-softmax and exp in :func:`~rlplane.generation.sampling.sample`; at 256 rows of a 49k vocabulary,
50 MB each). glibc serves a block above its mmap threshold (128 KiB at start, raised dynamically to at
most 32 MiB) with a fresh ``mmap`` and gives it back with ``munmap`` on free, and it trims the top of
the heap back to the OS once more than its trim threshold is free there. Each step then faults the
same pages in again, zeroed by the kernel. On the 2-core CPU (SmolLM2, 32 tokens), ``sample`` at
256 rows took 43-48 ms a step with glibc's defaults and 15-16 ms with these settings; at 64 rows ~4 ms.

:func:`keep_freed_memory` raises both thresholds to :data:`KEEP_BYTES`, so blocks up to that size come
from the heap and freed memory stays there for the next step. The cost is memory that is not given
back: the process keeps its high-water mark of freed blocks (reused by its next allocations, not by
other processes). Peak RSS of ``benchmarks/generation.py --batch-sizes 64,256``: 2136 MiB without,
2230-2354 MiB with (+4-10%). ``RLPLANE_KEEP_FREED_MEMORY=0`` turns it off. Other C libraries (musl,
macOS) have no ``mallopt``; there it does nothing.

Called once per process when an ``hf`` generation backend is built (:class:`HFGenerationBackend`):
every process that generates builds one (the CLI's local runtime, each Ray rollout worker, the
benchmarks), and a process that only trains or serves the data plane is left as it was.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

# mallopt's parameter numbers (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Blocks up to this size come from the heap, and up to this much free memory stays at the heap's top:
# above the largest per-step tensor of a generation (a (256, 151936) float32 Qwen logits is 156 MB).
KEEP_BYTES = 1 << 30
# Older glibc refuses an mmap threshold above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit); there the cap is set.
_CAPPED_MMAP_THRESHOLD = 32 << 20
ENV_VAR = "RLPLANE_KEEP_FREED_MEMORY"

_applied: bool | None = None  # the result of the first call: the settings are process-wide


def enabled() -> bool:
    """False when ``RLPLANE_KEEP_FREED_MEMORY`` is ``0``, ``false``, ``no`` or ``off``."""
    return os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "no", "off")


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds to :data:`KEEP_BYTES`, once per process.

    Returns whether the settings are in force: False when switched off (``RLPLANE_KEEP_FREED_MEMORY=0``),
    when the C library is not glibc, or when ``mallopt`` refused them. Later calls return the first
    call's answer without calling ``mallopt`` again.
    """
    global _applied
    if _applied is None:
        _applied = enabled() and _mallopt_keep()
    return _applied


def _mallopt_keep() -> bool:
    try:
        if not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
            return False
    except (ValueError, OSError, AttributeError):  # no such name: not glibc (macOS, musl, Windows)
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    # mallopt returns 1 on success, 0 when it rejects the value.
    mmap_set = libc.mallopt(_M_MMAP_THRESHOLD, KEEP_BYTES) or libc.mallopt(_M_MMAP_THRESHOLD, _CAPPED_MMAP_THRESHOLD)
    return bool(mmap_set) and bool(libc.mallopt(_M_TRIM_THRESHOLD, KEEP_BYTES))
