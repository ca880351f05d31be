"""Masked reductions shared by the algorithm kernels; branch-free on values (no ``.item()``, no sync)."""

from __future__ import annotations

import torch
from torch import Tensor


def as_tensor_like(value: float | Tensor, like: Tensor) -> Tensor:
    """``value`` as a 0-d (or broadcastable) tensor with ``like``'s dtype and device."""
    return torch.as_tensor(value, dtype=like.dtype, device=like.device)


def safe_div(num: Tensor, den: float | Tensor) -> Tensor:
    """``num / den`` where ``den != 0``, else 0 (an empty selection has mean 0, never NaN)."""
    den_t = as_tensor_like(den, num)
    nonzero = den_t != 0
    return torch.where(nonzero, num / torch.where(nonzero, den_t, torch.ones_like(den_t)), torch.zeros_like(num))


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """``Σ x·mask`` (over ``dim`` or all); masked positions give exactly 0 even where ``x`` is ±inf/NaN."""
    prod = torch.where(mask != 0, x * mask, torch.zeros_like(x))
    return prod.sum() if dim is None else prod.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """``Σ x·mask / Σ mask``; 0 where the mask is empty."""
    return safe_div(masked_sum(x, mask, dim), mask.to(x.dtype).sum() if dim is None else mask.to(x.dtype).sum(dim=dim))


def masked_whiten(x: Tensor, mask: Tensor, *, unbiased: bool, eps: float, clamp_var: bool = False) -> Tensor:
    """``(x − μ)·rsqrt(var + eps)`` (``rsqrt(max(var, eps))`` with ``clamp_var``) over the mask, 0 outside.

    ``var = Σ (x − μ)²·m / max(Σ m − unbiased, 1)``.
    """
    m = mask.to(x.dtype)
    n = m.sum()
    mu = safe_div(masked_sum(x, m), n)
    centered = torch.where(m != 0, x - mu, torch.zeros_like(x))
    den = torch.clamp(n - 1.0, min=1.0) if unbiased else torch.clamp(n, min=1.0)
    var = (centered.square() * m).sum() / den
    scale = torch.rsqrt(torch.clamp(var, min=eps)) if clamp_var else torch.rsqrt(var + eps)
    return centered * scale


def masked_extrema(x: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """(min, max) of ``x`` over ``valid`` positions; (+inf, −inf) when there are none."""
    inf = torch.tensor(float("inf"), dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return inf, -inf
    return torch.where(valid, x, inf).amin(), torch.where(valid, x, -inf).amax()
