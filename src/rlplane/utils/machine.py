"""One line that says which machine a figure came from: CPU model, cores, the instruction sets that change
numerics and speed, torch. Learning curves and timings differ by CPU family (AVX2, AVX-512, AMX), so every
sweep table and benchmark prints it."""

from __future__ import annotations

import os
import platform

# The flags that pick torch's kernels (and so rounding and speed) on x86 and Arm.
NOTABLE_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile",
                 "asimd", "sve", "bf16")


def cpu_model() -> str:
    """The CPU's model name as the OS reports it (``/proc/cpuinfo``), else ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() in ("model name", "Model", "Hardware"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def describe_machine() -> str:
    """``<CPU model>, <n> cores; <notable flags>; torch <version>``."""
    import torch

    from rlplane.models.precision import cpu_flags  # torch is imported by then anyway

    flags = [f for f in NOTABLE_FLAGS if f in cpu_flags()]
    return f"{cpu_model()}, {cores()} cores; {' '.join(flags) or 'no notable flags'}; torch {torch.__version__}"
