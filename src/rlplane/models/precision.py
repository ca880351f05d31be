"""Numeric precision of forward passes: fp32, bf16 autocast, or ``auto`` (the default).

With ``bf16`` the parameters and optimizer state stay fp32 (master weights) and matmuls run in bf16
under ``torch.autocast``; logprobs and the loss are computed from fp32-cast logits either way.
Generation and training forwards both go through :func:`autocast`, so ``generation_logprobs`` and
the trainer's logprobs come from the same precision (``token_mult_prob_error`` stays near 1).

``auto`` picks bf16 where the hardware runs bf16 matmuls natively and fp32 elsewhere. Whether a CPU
does is timed, not guessed from its name: one CPU model string covers machines with
``avx512_bf16`` (bf16 matmuls faster than fp32) and machines without it (bf16 much slower; figures in
``docs/benchmarks.md``). :func:`cpu_bf16_speedup` times a short bf16-vs-fp32 matmul once per
process. Models narrower than ``MIN_AUTO_BF16_HIDDEN`` stay fp32 under ``auto``: their matmuls are
too small for bf16 to pay for the casts autocast adds around every op.

The choice is stored on the model (``model.rlplane_autocast_dtype``), so copies of it (the reference
policy, the async collector's generator) inherit it, and every forward in rlplane goes through
:func:`autocast`.
"""

from __future__ import annotations

import contextlib
import functools
import time

import torch

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}
CHOICES = ("auto", *PRECISIONS)

# auto picks bf16 on a CPU only when its bf16 matmul is at least this much faster than fp32. CPUs with
# and without native bf16 sit far on either side, so noise from a busy machine cannot flip the choice
# between processes of one run.
MIN_CPU_BF16_SPEEDUP = 1.3
# auto keeps fp32 for models with hidden_size below this. The default job's tiny Llama (hidden 128,
# 0.4M parameters) gains nothing from bf16: its forwards are dominated by per-op overhead, which
# autocast's casts add to.
MIN_AUTO_BF16_HIDDEN = 256
_BENCH_SHAPE = (256, 576, 1536)  # (tokens, hidden, MLP width) of SmolLM2-135M's MLP up-projection


class FP32OutputLinear(torch.nn.Linear):
    """The output projection (lm_head) computed in fp32 even under bf16 autocast.

    Why: logits rounded to bf16 carry an absolute error of up to ~0.06 at |logit| ~ 16, and the
    sampler's and the trainer's logprobs then differ by that much (``token_mult_prob_error`` with and
    without it: ``docs/benchmarks.md``). The lm_head is a large share of a small model's matmul FLOPs;
    the trainer runs it only at the tokens the loss reads (``workers/policy.py``: microbatch_logprobs),
    which on a chat prompt is a small part of each row.
    Installed by :func:`set_precision` as a class swap, so parameter names, tied weights and
    ``state_dict`` stay those of the plain ``nn.Linear``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return super().forward(x.to(self.weight.dtype))  # fp32 master weights: fp32


def set_precision(model: torch.nn.Module, precision: str) -> None:
    """Record ``precision`` (``"fp32"`` or ``"bf16"``; resolve ``"auto"`` first) on ``model`` for :func:`autocast`.

    Under bf16 the output projection stays fp32 (:class:`FP32OutputLinear`).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision = {precision!r}: must be one of {', '.join(PRECISIONS)}")
    model.rlplane_autocast_dtype = PRECISIONS[precision]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and type(head) in (torch.nn.Linear, FP32OutputLinear):
        head.__class__ = FP32OutputLinear if precision == "bf16" else torch.nn.Linear


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
    """fp32 time / bf16 time of a SmolLM2-MLP-sized matmul on this CPU (best of ~25 ms each; once per process).

    Best-of rather than mean: another process taking the core slows a repeat, never speeds it up.
    """
    return _matmul_seconds(torch.float32, budget_s) / _matmul_seconds(torch.bfloat16, budget_s)


def resolve_precision(precision: str, model: torch.nn.Module) -> tuple[str, str]:
    """``(precision, why)``: ``"fp32"``/``"bf16"`` as given, or what ``"auto"`` picks for ``model`` here."""
    if precision != "auto":
        if precision not in PRECISIONS:
            raise ValueError(f"precision = {precision!r}: must be one of {', '.join(CHOICES)}")
        return precision, "set in the config"
    hidden = getattr(getattr(model, "config", None), "hidden_size", None)
    if hidden is not None and hidden < MIN_AUTO_BF16_HIDDEN:
        return "fp32", f"hidden_size {hidden} < {MIN_AUTO_BF16_HIDDEN}: too small a model for bf16 to pay"
    device = next(model.parameters()).device
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


def apply_precision(model: torch.nn.Module, precision: str, announce: bool = True) -> str:
    """Resolve ``precision`` for ``model``, record it (:func:`set_precision`) and return it.

    With ``announce`` the choice is printed in one line, once per process and distinct choice
    (the policy is loaded by several workers in one process).
    """
    chosen, why = resolve_precision(precision, model)
    set_precision(model, chosen)
    if announce and (precision, chosen) not in _announced:
        _announced.add((precision, chosen))
        print(f"policy.precision: {precision} -> {chosen} ({why})", flush=True)
    return chosen
