"""The PPO critic's loss (clipped MSE) and the explained variance of its values."""

from __future__ import annotations

import torch
from torch import Tensor

from rlplane.algorithms._ops import as_tensor_like, masked_extrema, masked_sum, safe_div


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    token_mask: Tensor,
    global_valid_tokens: float | Tensor,
    clip_range: float | None = None,
    *,
    sample_mask: Tensor | None = None,
    scale: float = 1.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped MSE value loss of the PPO critic (NeMo RL's ``value_loss_fn``).

    ``L = 0.5·scale·Σ max((v − R)², (v_clip − R)²)·m / N``, ``v_clip = clamp(v, v_old ± ε)`` (no clip term
    without ``clip_range``), ``m = token_mask·sample_mask``, N = ``global_valid_tokens``. Metrics are
    token-normalised sums (``values_min/max``: min/max); explained variance comes from them via
    :func:`explained_variance`. Shapes (B, T), values right-shifted (V(s_t) at t); ``sample_mask`` (B,).
    """
    dtype = torch.promote_types(values.dtype, torch.float32)
    sm = torch.ones(values.shape[0], dtype=dtype,
                    device=values.device) if sample_mask is None else sample_mask.to(dtype)
    m = token_mask.to(dtype) * sm[:, None]
    valid = m != 0
    n_tok = as_tensor_like(global_valid_tokens, m)

    def clean(x: Tensor) -> Tensor:
        return torch.where(valid, x.to(dtype), torch.zeros((), dtype=dtype, device=x.device))

    v, v_old, ret = clean(values), clean(old_values), clean(returns)
    sq = (v - ret).square()
    if clip_range is not None and clip_range > 0:
        v_clip = torch.clamp(v, v_old - clip_range, v_old + clip_range)
        sq_clip = (v_clip - ret).square()
        per_token = torch.maximum(sq, sq_clip)
        clipfrac = safe_div(masked_sum((sq_clip > sq).to(dtype), m), n_tok)
    else:
        per_token = sq
        clipfrac = torch.zeros((), dtype=dtype, device=values.device)
    loss = 0.5 * scale * safe_div(masked_sum(per_token, m), n_tok)
    with torch.no_grad():
        vd = v.detach()
        vmin, vmax = masked_extrema(vd, valid)
        metrics = {
            "loss": loss.detach(),
            "vf_clipfrac": clipfrac.detach(),
            "returns_mean": safe_div(masked_sum(ret, m), n_tok),
            "returns_sq_mean": safe_div(masked_sum(ret.square(), m), n_tok),
            "values_mean": safe_div(masked_sum(vd, m), n_tok),
            "residual_sq_mean": safe_div(masked_sum((ret - vd).square(), m), n_tok),
            "values_min": vmin,
            "values_max": vmax,
            "num_valid_samples": sm.sum(),
        }
    return loss, metrics


def explained_variance(
    returns_mean: Tensor | float, values_mean: Tensor | float, returns_sq_mean: Tensor | float,
    residual_sq_mean: Tensor | float,
) -> Tensor:
    """Critic explained variance from summed :func:`value_loss` metrics (1 perfect, 0 constant, < 0 worse).

    ``EV = 1 − (E[(R − V)²] − (μ_R − μ_V)²) / max(E[R²] − μ_R², 1e-8)``.
    """
    mu_r, mu_v = torch.as_tensor(returns_mean, dtype=torch.float64), torch.as_tensor(values_mean, dtype=torch.float64)
    var_resid = torch.as_tensor(residual_sq_mean, dtype=torch.float64) - (mu_r - mu_v).square()
    var_r = torch.clamp(torch.as_tensor(returns_sq_mean, dtype=torch.float64) - mu_r.square(), min=1e-8)
    return 1.0 - var_resid / var_r
