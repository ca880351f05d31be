"""Numeric precision of forward passes: fp32, bf16 autocast, or ``auto`` (the default).

bf16 keeps fp32 master weights and optimizer state with bf16 matmuls under ``torch.autocast``; generation
and training both use :func:`autocast`, so their logprobs match. ``auto`` picks bf16 where the device has
native bf16 arithmetic and the model is wide enough: a GPU that reports bf16 support, a CPU whose feature flags
name bf16 instructions (:func:`cpu_bf16_instructions`). The choice is a function of the hardware's features and
the model's width, never of a timing, so a busy machine makes the same choice as an idle one. It is stored on the
model (``rlplane_autocast_dtype``), so copies inherit it.
"""

from __future__ import annotations

import contextlib
import functools
import platform
import subprocess

import torch

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}
CHOICES = ("auto", *PRECISIONS)

# CPU feature flags (Linux /proc/cpuinfo names) of native bf16 arithmetic: AVX-512 BF16 dot products (AMD Zen 4+,
# Intel Cooper Lake+), AMX tiles (Intel Sapphire Rapids+), Arm's BF16 extension (``bf16`` in aarch64 Features).
# Without them oneDNN emulates bf16 matmuls, 3-20x slower than fp32 (docs/benchmarks.md).
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
# auto keeps fp32 below this hidden size: per-op overhead dominates, and autocast adds casts.
MIN_AUTO_BF16_HIDDEN = 256


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


@contextlib.contextmanager
def weight_casts_kept(model: torch.nn.Module, enabled: bool = True):
    """Inside it, the low-precision copies autocast makes of ``model``'s weights at the first forward serve every
    later forward: one cast per weight for a whole optimizer step's micro-batches, not one per micro-batch.

    torch keeps autocast's cast cache (fp32 leaves that require grad) until the outermost autocast region exits;
    this holds one open, autocast itself left off, so backward passes and the loss run as before and the numbers
    are the same bit for bit. Only while the weights stay unchanged (no optimizer step inside). A no-op for an fp32
    model, an FSDP-sharded one (its parameters are gathered afresh for each forward) or with ``enabled=False``.
    """
    from torch.distributed.fsdp import FSDPModule

    if not enabled or getattr(model, "rlplane_autocast_dtype", None) is None or isinstance(model, FSDPModule):
        yield
        return
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()


def _linux_cpu_flags(cpuinfo: str) -> set[str]:
    """The feature flags of the first processor in ``/proc/cpuinfo`` text (x86 ``flags``, Arm ``Features``)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            return set(value.split())
    return set()


def _macos_cpu_flags() -> set[str]:
    """``bf16`` where macOS reports Arm's BF16 extension (Apple M2 and later)."""
    try:
        out = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True, text=True,
                             timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return set()
    return {"bf16"} if out == "1" else set()


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as the OS reports them (empty where it does not)."""
    if platform.system() == "Darwin":
        return frozenset(_macos_cpu_flags())
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(_linux_cpu_flags(f.read()))
    except OSError:
        return frozenset()


def cpu_bf16_instructions(flags: frozenset[str] | set[str] | None = None) -> list[str]:
    """The native-bf16 flags among ``flags`` (default: this CPU's), in :data:`CPU_BF16_FLAGS` order."""
    have = cpu_flags() if flags is None else flags
    return [f for f in CPU_BF16_FLAGS if f in have]


def hidden_size_of(model: torch.nn.Module) -> int | None:
    """The model's hidden size from its config (None where it has none)."""
    return getattr(getattr(model, "config", None), "hidden_size", None)


def resolve_precision(precision: str, model: torch.nn.Module, device: torch.device | None = None) -> tuple[str, str]:
    """``(precision, why)``: ``"fp32"``/``"bf16"`` as given, or what ``"auto"`` picks for ``model`` on ``device``
    (default: where its parameters are now; a model loaded on the host for a GPU passes the GPU)."""
    hidden = hidden_size_of(model)
    if device is None and precision == "auto":
        device = next(model.parameters()).device
    return choose_precision(precision, hidden, device)


def choose_precision(precision: str, hidden_size: int | None, device: torch.device | str | None) -> tuple[str, str]:
    """:func:`resolve_precision` from a model's hidden size (its config alone: no weights needed)."""
    if precision != "auto":
        if precision not in PRECISIONS:
            raise ValueError(f"precision = {precision!r}: must be one of {', '.join(CHOICES)}")
        return precision, "set in the config"
    if hidden_size is not None and hidden_size < MIN_AUTO_BF16_HIDDEN:
        return "fp32", f"hidden_size {hidden_size} < {MIN_AUTO_BF16_HIDDEN}: too small a model for bf16 to pay"
    device = torch.device(device if device is not None else "cpu")
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bf16", f"{torch.cuda.get_device_name(device)} supports bf16"
        return "fp32", f"{torch.cuda.get_device_name(device)} lacks native bf16"
    if device.type != "cpu":
        return "fp32", f"device {device.type}: bf16 support not checked"
    native = cpu_bf16_instructions()
    if native:
        return "bf16", f"this CPU has native bf16 ({', '.join(native)})"
    return "fp32", f"this CPU lacks native bf16 (none of {', '.join(CPU_BF16_FLAGS)} in its flags)"


_announced: set[tuple[str, str]] = set()


def apply_precision(model: torch.nn.Module, precision: str, announce: bool = True,
                    device: torch.device | None = None) -> str:
    """Resolve ``precision`` for ``model`` on ``device``, record and return it; ``announce`` prints what ``auto``
    chose, once per process (a precision the config names is the run plan's to show)."""
    chosen, why = resolve_precision(precision, model, device)
    set_precision(model, chosen)
    if announce and precision == "auto" and (precision, chosen) not in _announced:
        _announced.add((precision, chosen))
        print(f"policy.precision: {precision} -> {chosen} ({why})", flush=True)
    return chosen


def precision_of(model: torch.nn.Module) -> str:
    """The precision :func:`set_precision` recorded on ``model`` (``"fp32"`` when none was)."""
    return "bf16" if getattr(model, "rlplane_autocast_dtype", None) == torch.bfloat16 else "fp32"
