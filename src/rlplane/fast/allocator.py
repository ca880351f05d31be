"""Keep freed memory in the process (glibc ``mallopt``), so decode steps stop faulting the same pages in.

Each step frees and reallocates large tensors (the (B, V) logits); raising the mmap and trim thresholds to
:data:`KEEP_BYTES` keeps them in the heap. Applied once per process when an ``hf`` backend is built.
Plain twin: glibc's defaults (``RLPLANE_KEEP_FREED_MEMORY=0``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

from rlplane.fast.switches import KEEP_FREED_MEMORY, enabled

# mallopt's parameter numbers (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Above the largest per-step tensor of a generation (Qwen's (256, 151936) float32 logits: 156 MB).
KEEP_BYTES = 1 << 30
# Older glibc refuses an mmap threshold above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit); there the cap is set.
_CAPPED_MMAP_THRESHOLD = 32 << 20
ENV_VAR = KEEP_FREED_MEMORY

_applied: bool | None = None  # the result of the first call: the settings are process-wide


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds to :data:`KEEP_BYTES` once per process; whether they are in force
    (False when off, not glibc, or refused)."""
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
