"""The environment variables that turn :mod:`rlplane.fast` settings off (``0``/``false``/``no``/``off``;
``RLPLANE_FAST`` for all), read when each setting is applied."""

from __future__ import annotations

import os

from rlplane.errors import ConfigError

ALL = "RLPLANE_FAST"
FUSED_DECODE = "RLPLANE_FUSED_DECODE"  # generation.hf_decode: auto runs the model's own forward
CUDA_GRAPH_DECODE = "RLPLANE_CUDA_GRAPH_DECODE"  # hf_decode: auto on CUDA runs the fused decoder without graphs
ONEDNN_LINEAR = "RLPLANE_ONEDNN_LINEAR"  # the fused decoder's fp32 output projection through F.linear
KEEP_FREED_MEMORY = "RLPLANE_KEEP_FREED_MEMORY"  # glibc's default mmap and trim thresholds
FEW_ARENAS = "RLPLANE_FEW_ARENAS"  # glibc's default count of malloc arenas
FREEZE_HEAP = "RLPLANE_FREEZE_HEAP"  # no gc.freeze()
SET_THREADS = "RLPLANE_SET_THREADS"  # torch's own thread count unless policy.threads_per_worker is set; no nice
SPARSE_EMBEDDING_GRAD = "RLPLANE_SPARSE_EMBEDDING_GRAD"  # a tied embedding's dense backward in training
MATMUL_ATTENTION_BACKWARD = "RLPLANE_MATMUL_ATTENTION_BACKWARD"  # SDPA's own backward in bf16 CPU training

_OFF = ("0", "false", "no", "off")
_ON = ("", "1", "true", "yes", "on")
SWITCHES = (ALL, FUSED_DECODE, CUDA_GRAPH_DECODE, ONEDNN_LINEAR, KEEP_FREED_MEMORY, FEW_ARENAS, FREEZE_HEAP,
            SET_THREADS, SPARSE_EMBEDDING_GRAD, MATMUL_ATTENTION_BACKWARD)


def enabled(var: str) -> bool:
    """False when ``var`` or ``RLPLANE_FAST`` is set to ``0``/``false``/``no``/``off``."""
    return all(os.environ.get(v, "1").strip().lower() not in _OFF for v in (ALL, var))


def check_switches() -> None:
    """A ``ConfigError`` for a switch set to neither an on nor an off word (``RLPLANE_FAST=disable`` read
    as on, silently, the opposite of what was meant)."""
    for var in SWITCHES:
        value = os.environ.get(var)
        if value is not None and value.strip().lower() not in _OFF + _ON:
            raise ConfigError([f"environment variable {var}={value!r}: not a switch value; use 0/false/no/off "
                               "to turn it off, 1/true/yes/on (or unset) for on"])
