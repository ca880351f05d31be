"""Aggregation of per-micro-batch metrics into per-step numbers.

Loss metrics come normalised by global counts: they sum over micro-batches and average over global
batches (as NeMo RL). Extrema (`*_min`, `min_*`, ...) reduce by min/max ignoring ±inf; a merged extremum
with no value is reported as -1.
"""

from __future__ import annotations

import math

import torch


def _extremum(key: str) -> str | None:
    """``"min"`` or ``"max"`` for an extremum's key (``*_min``/``min_*``, ``*_max``/``max_*``), else None."""
    for kind in ("min", "max"):
        if key.endswith(f"_{kind}") or key.startswith(f"{kind}_"):
            return kind
    return None


def reduce_microbatch_metrics(per_mb: list[dict[str, torch.Tensor]], num_global_batches: int = 1) -> dict[str, float]:
    out: dict[str, float] = {}
    if not per_mb:
        return out
    for key in per_mb[0]:
        vals = torch.stack([torch.as_tensor(m[key], dtype=torch.float64).reshape(()) for m in per_mb])
        kind = _extremum(key)
        if kind is not None:
            finite = vals[torch.isfinite(vals)]
            if finite.numel() == 0:
                out[key] = math.inf if kind == "min" else -math.inf
            else:
                out[key] = float(finite.min() if kind == "min" else finite.max())
        else:
            out[key] = float(vals.sum() / num_global_batches)
    return out


def merge_rank_metrics(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """Combine DP ranks' metrics: sums add, extrema min/max (none: -1), settings and global counts from rank 0."""
    out: dict[str, float] = {}
    same_on_every_rank = {"lr", "grad_norm", "global_valid_toks", "global_valid_seqs"}
    for key, first in per_rank[0].items():
        vals = [r[key] for r in per_rank]
        if key in same_on_every_rank:
            out[key] = first
        elif _extremum(key) is not None:
            finite = [v for v in vals if math.isfinite(v)]
            out[key] = (min(finite) if _extremum(key) == "min" else max(finite)) if finite else -1.0
        else:
            out[key] = float(sum(vals)) if len(vals) > 1 else first
    return out
