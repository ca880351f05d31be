"""Numeric precision of forward passes: fp32, or bf16 autocast on CPU.

With ``policy.precision: bf16`` the parameters and optimizer state stay fp32 (master weights) and
matmuls run in bf16 under ``torch.autocast``: on this CPU that is ~1.4x faster for SmolLM2
generation and ~1.7x for a training step (``reference/machine_notes.md`` §5). Logprobs and the loss
are computed from fp32-cast logits either way. The choice is stored on the model
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


def autocast(model: torch.nn.Module):
    """The context a forward of ``model`` runs in: bf16 autocast if so configured, else nothing."""
    dtype = getattr(model, "rlplane_autocast_dtype", None)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=dtype)
