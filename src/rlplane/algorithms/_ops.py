"""Small masked-reduction helpers shared by the algorithm kernels.

Every helper is branch-free on tensor values (no ``.item()``), so it never forces a device sync.
Shape legend: B = batch (sequences), T = tokens per sequence.
"""

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
    """``Σ x·mask`` (over ``dim`` or everything). Positions with mask 0 contribute exactly 0,
    even when ``x`` is ±inf or NaN there."""
    prod = torch.where(mask != 0, x * mask, torch.zeros_like(x))
    return prod.sum() if dim is None else prod.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """``Σ x·mask / Σ mask``; 0 where the mask is empty."""
    return safe_div(masked_sum(x, mask, dim), mask.to(x.dtype).sum() if dim is None else mask.to(x.dtype).sum(dim=dim))


def masked_whiten(x: Tensor, mask: Tensor, *, unbiased: bool, eps: float, clamp_var: bool = False) -> Tensor:
    """Whiten ``x`` over the positions where ``mask`` is set.

    ``(x − μ)·rsqrt(var + eps)`` (or ``rsqrt(max(var, eps))`` with ``clamp_var``), where
    ``μ = Σ x·m / Σ m`` and ``var = Σ (x − μ)²·m / (Σ m − unbiased)``. The denominator is floored
    at 1 so a single valid position gives var 0 instead of NaN. Positions outside the mask are
    returned as 0.
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
