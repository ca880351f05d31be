"""Keep freed memory in the process (glibc ``mallopt``), so decode steps stop faulting the same pages in; and
keep it in few malloc arenas, so a thread reuses what another freed.

Each step frees and reallocates large tensors (the (B, V) logits); raising the mmap and trim thresholds to
:data:`KEEP_BYTES` keeps them in the heap. Applied once per process when an ``hf`` backend or a trainer on the CPU
is built (training frees and reallocates tens of MB a micro-batch too).
Plain twin: glibc's defaults (``RLPLANE_KEEP_FREED_MEMORY=0``).

glibc gives threads up to 8 arenas per core, each keeping its own freed memory. A process whose threads come and
go (the async collector starts one per generation batch) spreads its allocations over all of them, and each
arena's touched part creeps up: the Ray collector actor's RSS did, arena after arena (``docs/benchmarks.md``).
:data:`MALLOC_ARENAS` arenas hold it flat. Applied where the freed memory is kept.
Plain twin: glibc's count (``RLPLANE_FEW_ARENAS=0``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

from rlplane.fast.switches import FEW_ARENAS, KEEP_FREED_MEMORY, enabled

# mallopt's parameter numbers (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MALLOC_ARENAS = 2  # the main arena and one more: a worker's threads are one computing thread and Ray's helpers
# Above the largest per-step tensor of a generation (Qwen's (256, 151936) float32 logits: 156 MB).
KEEP_BYTES = 1 << 30
# Older glibc refuses an mmap threshold above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit); there the cap is set.
_CAPPED_MMAP_THRESHOLD = 32 << 20
ENV_VAR = KEEP_FREED_MEMORY
FEW_ARENAS_VAR = FEW_ARENAS

_applied: bool | None = None  # the result of the first call: the settings are process-wide
_arenas_limited: bool | None = None


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds to :data:`KEEP_BYTES` once per process; whether they are in force
    (False when off, not glibc, or refused)."""
    global _applied
    if _applied is None:
        _applied = enabled(ENV_VAR) and _mallopt_keep()
    return _applied


def _mallopt_keep() -> bool:
    if not _is_glibc():
        return False
    libc = _libc()
    # mallopt returns 1 on success, 0 when it rejects the value.
    mmap_set = libc.mallopt(_M_MMAP_THRESHOLD, KEEP_BYTES) or libc.mallopt(_M_MMAP_THRESHOLD, _CAPPED_MMAP_THRESHOLD)
    return bool(mmap_set) and bool(libc.mallopt(_M_TRIM_THRESHOLD, KEEP_BYTES))


def limit_malloc_arenas() -> bool:
    """Cap glibc's malloc arenas at :data:`MALLOC_ARENAS` once per process (threads started later share them);
    whether the cap is in force (False when off, not glibc, or refused)."""
    global _arenas_limited
    if _arenas_limited is None:
        _arenas_limited = enabled(FEW_ARENAS) and _is_glibc() and bool(_libc().mallopt(_M_ARENA_MAX, MALLOC_ARENAS))
    return _arenas_limited


def _is_glibc() -> bool:
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (ValueError, OSError, AttributeError):  # no such name: not glibc (macOS, musl, Windows)
        return False


def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
