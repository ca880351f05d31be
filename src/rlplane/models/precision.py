"""Numeric precision of forward passes: fp32, bf16 autocast, or ``auto`` (the default).

bf16 keeps fp32 master weights and optimizer state with bf16 matmuls under ``torch.autocast``; generation
and training both use :func:`autocast`, so their logprobs match. ``auto`` picks bf16 where a timed matmul
shows native bf16 (:func:`cpu_bf16_speedup`) and the model is wide enough. The choice is stored on the
model (``rlplane_autocast_dtype``), so copies inherit it.
"""

from __future__ import annotations

import contextlib
import functools
import time

import torch

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}
CHOICES = ("auto", *PRECISIONS)

# auto picks bf16 on a CPU only when its bf16 matmul is this much faster (far from either kind of CPU).
MIN_CPU_BF16_SPEEDUP = 1.3
# auto keeps fp32 below this hidden size: per-op overhead dominates, and autocast adds casts.
MIN_AUTO_BF16_HIDDEN = 256
_BENCH_SHAPE = (256, 576, 1536)  # (tokens, hidden, MLP width) of SmolLM2-135M's MLP up-projection


class FP32OutputLinear(torch.nn.Linear):
    """The lm_head computed in fp32 even under bf16 autocast (bf16 logits differ by up to ~0.06 at |logit| ~ 16).

    A class swap by :func:`set_precision`, so names, tied weights and ``state_dict`` stay ``nn.Linear``'s.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return super().forward(x.to(self.weight.dtype))  # fp32 master weights: fp32


def set_precision(model: torch.nn.Module, precision: str) -> None:
    """Record ``precision`` (``"fp32"``/``"bf16"``) on ``model`` for :func:`autocast`; bf16 keeps an fp32 lm_head."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision = {precision!r}: must be one of {', '.join(PRECISIONS)}")
    model.rlplane_autocast_dtype = PRECISIONS[precision]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and type(head) in (torch.nn.Linear, FP32OutputLinear):
        head.__class__ = FP32OutputLinear if precision == "bf16" else torch.nn.Linear


def autocast(model: torch.nn.Module, device_type: str | None = None):
    """The context a forward of ``model`` runs in: bf16 autocast on its parameters' device if configured."""
    dtype = getattr(model, "rlplane_autocast_dtype", None)
    if dtype is None:
        return contextlib.nullcontext()
    device_type = device_type or next(model.parameters()).device.type
    return torch.autocast(device_type=device_type, dtype=dtype)


def _matmul_seconds(dtype: torch.dtype, budget_s: float) -> float:
    """Best time of one ``(m, k) @ (k, n)`` matmul in ``dtype`` over ``budget_s`` seconds of repeats."""
    m, k, n = _BENCH_SHAPE
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=gen).to(dtype), torch.randn(k, n, generator=gen).to(dtype)
    a @ b  # first call: kernel selection, packing buffers
    best = float("inf")
    deadline = time.perf_counter() + budget_s
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return best


@functools.lru_cache(maxsize=1)
def cpu_bf16_speedup(budget_s: float = 0.025) -> float:
    """fp32 time / bf16 time of a SmolLM2-MLP-sized matmul on this CPU (best-of, once per process)."""
    return _matmul_seconds(torch.float32, budget_s) / _matmul_seconds(torch.bfloat16, budget_s)


def resolve_precision(precision: str, model: torch.nn.Module, device: torch.device | None = None) -> tuple[str, str]:
    """``(precision, why)``: ``"fp32"``/``"bf16"`` as given, or what ``"auto"`` picks for ``model`` on ``device``
    (default: where its parameters are now; a model loaded on the host for a GPU passes the GPU)."""
    if precision != "auto":
        if precision not in PRECISIONS:
            raise ValueError(f"precision = {precision!r}: must be one of {', '.join(CHOICES)}")
        return precision, "set in the config"
    hidden = getattr(getattr(model, "config", None), "hidden_size", None)
    if hidden is not None and hidden < MIN_AUTO_BF16_HIDDEN:
        return "fp32", f"hidden_size {hidden} < {MIN_AUTO_BF16_HIDDEN}: too small a model for bf16 to pay"
    device = torch.device(device) if device is not None else next(model.parameters()).device
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bf16", f"{torch.cuda.get_device_name(device)} supports bf16"
        return "fp32", f"{torch.cuda.get_device_name(device)} lacks native bf16"
    if device.type != "cpu":
        return "fp32", f"device {device.type}: bf16 support not checked"
    speedup = cpu_bf16_speedup()
    verdict = "bf16" if speedup >= MIN_CPU_BF16_SPEEDUP else "fp32"
    return verdict, f"bf16 matmul {speedup:.2f}x as fast as fp32 on this CPU (bf16 needs >= {MIN_CPU_BF16_SPEEDUP}x)"


_announced: set[tuple[str, str]] = set()


def apply_precision(model: torch.nn.Module, precision: str, announce: bool = True,
                    device: torch.device | None = None) -> str:
    """Resolve ``precision`` for ``model`` on ``device``, record and return it; ``announce`` prints it once per
    process."""
    chosen, why = resolve_precision(precision, model, device)
    set_precision(model, chosen)
    if announce and (precision, chosen) not in _announced:
        _announced.add((precision, chosen))
        print(f"policy.precision: {precision} -> {chosen} ({why})", flush=True)
    return chosen
