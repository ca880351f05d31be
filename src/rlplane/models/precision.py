"""Numeric precision of forward passes: fp32, or bf16 autocast on the model's device.

With ``policy.precision: bf16`` the parameters and optimizer state stay fp32 (master weights) and
matmuls run in bf16 under ``torch.autocast``. Logprobs and the loss are computed from fp32-cast
logits either way. Whether it pays depends on the CPU's bf16 support: on the 2-core development
machine, SmolLM2 logprobs of 8 x 100 tokens took 4.0 s (fp32) vs 12.6 s (bf16) forward and 8.8 s vs
171 s forward + backward, so the presets use fp32; on a GPU or a CPU with AMX/AVX512-BF16 it is the
usual choice. The choice is stored on the model
(``model.rlplane_autocast_dtype``), so copies of it (the reference policy) inherit it, and every
forward in rlplane goes through :func:`autocast`.
"""

from __future__ import annotations

import contextlib

import torch

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}


def set_precision(model: torch.nn.Module, precision: str) -> None:
    """Record ``precision`` (``"fp32"`` or ``"bf16"``) on ``model`` for :func:`autocast`."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision = {precision!r}: must be one of {', '.join(PRECISIONS)}")
    model.rlplane_autocast_dtype = PRECISIONS[precision]


def autocast(model: torch.nn.Module, device_type: str | None = None):
    """The context a forward of ``model`` runs in: bf16 autocast if so configured, else nothing.

    Autocast only acts on ops of its own device type, so it follows the device of ``model``'s
    parameters (``device_type`` overrides): a CUDA model under CPU autocast would run fp32.
    """
    dtype = getattr(model, "rlplane_autocast_dtype", None)
    if dtype is None:
        return contextlib.nullcontext()
    device_type = device_type or next(model.parameters()).device.type
    return torch.autocast(device_type=device_type, dtype=dtype)
