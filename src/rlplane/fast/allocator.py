"""Keep freed memory in the process: glibc's ``mallopt`` so that decode steps stop paying page faults.

A decode step allocates and frees the same large CPU tensors every step (the (B, V) logits and their
log-softmax). glibc serves a block above its mmap threshold with a fresh ``mmap``, unmaps it on
free, and trims free memory at the heap's top, so each step faults the same pages in again.
:func:`keep_freed_memory` raises both thresholds to :data:`KEEP_BYTES`: freed blocks stay in the heap
for the next step, at the cost of keeping the process's high-water mark of freed memory.
Plain twin: glibc's defaults (``RLPLANE_KEEP_FREED_MEMORY=0``; other C libraries have no ``mallopt``).
Applied once per process when an ``hf`` generation backend is built.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

from rlplane.fast.switches import KEEP_FREED_MEMORY, enabled

# mallopt's parameter numbers (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Blocks up to this size come from the heap, and up to this much free memory stays at the heap's top:
# above the largest per-step tensor of a generation (a (256, 151936) float32 Qwen logits is 156 MB).
KEEP_BYTES = 1 << 30
# Older glibc refuses an mmap threshold above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit); there the cap is set.
_CAPPED_MMAP_THRESHOLD = 32 << 20
ENV_VAR = KEEP_FREED_MEMORY

_applied: bool | None = None  # the result of the first call: the settings are process-wide


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds to :data:`KEEP_BYTES`, once per process.

    Returns whether the settings are in force: False when switched off (``RLPLANE_KEEP_FREED_MEMORY=0``),
    when the C library is not glibc, or when ``mallopt`` refused them. Later calls return the first
    call's answer without calling ``mallopt`` again.
    """
    global _applied
    if _applied is None:
        _applied = enabled(ENV_VAR) and _mallopt_keep()
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
