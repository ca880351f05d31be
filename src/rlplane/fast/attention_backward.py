"""A bf16 training forward's attention on the CPU: SDPA's own forward, its gradient from a few batched matmuls.

torch's flash-attention backward on the CPU is slow at the short lengths of RL replies: SmolLM2's micro-batches
of ~11 x 70 tokens spend ~20 ms a layer in it against ~2 ms in its forward, a fifth of the training phase
(docs/benchmarks.md). The gradient of softmax attention over T x S scores that small is five matmuls. This keeps
the forward call as it was (the same kernel and inputs: the same output bit for bit, so logprobs, the loss and
its metrics do not change) and computes the backward in fp32 from the bf16 operands the forward used, as the
flash kernel does (fp32 accumulation), rounding differently.

Applied inside :func:`matmul_attention_backward`'s context (the trainer's micro-batch loop) to a call that needs a
gradient, on CPU tensors the forward computes in bf16 (autocast or bf16 inputs), without dropout, whose scores fit
:data:`MAX_SCORES` elements; any other call runs as before. A model without bf16 (the tiny embedded ones) is left
alone, so its numbers stay as they were, and so is one with activation checkpointing: its forward is recomputed in
the backward, outside the context, and must save what the first forward saved.
Twin: SDPA's own backward; off: ``RLPLANE_MATMUL_ATTENTION_BACKWARD=0``.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from rlplane.fast.switches import MATMUL_ATTENTION_BACKWARD, enabled

# batch x query heads x queries x keys: the backward holds three fp32 score tensors (192 MiB at this size).
MAX_SCORES = 1 << 24


def scores_fit(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether a call's (batch x heads x T x S) scores are small enough for the matmul backward."""
    return math.prod(q.shape[:-1]) * k.shape[-2] <= MAX_SCORES


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype | None:
    """The dtype SDPA computes these CPU tensors in: autocast's where it is on, else theirs when all agree."""
    if torch.is_autocast_enabled("cpu"):
        return torch.get_autocast_dtype("cpu")
    dtypes = {t.dtype for t in tensors}
    return dtypes.pop() if len(dtypes) == 1 else None


def _applies(q, k, v, attn_mask, dropout_p) -> bool:
    """Whether the call gets the matmul backward; its compute dtype is then bf16 (:func:`_compute_dtype`)."""
    return (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)) and dropout_p == 0.0
            and all(t.device.type == "cpu" for t in (q, k, v)) and _compute_dtype(q, k, v) == torch.bfloat16
            and (attn_mask is None or attn_mask.dtype == torch.bool or attn_mask.is_floating_point())
            and q.dim() == 4 and scores_fit(q, k))


class _SDPAMatmulBackward(torch.autograd.Function):
    """``F.scaled_dot_product_attention`` forward; backward recomputes the probabilities and applies the chain rule
    in fp32. Inputs are already in the compute dtype (the caller casts as autocast would)."""

    @staticmethod
    def forward(ctx, q, k, v, attn_mask, is_causal, scale, enable_gqa):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                                             enable_gqa=enable_gqa)
        ctx.save_for_backward(q, k, v, out, attn_mask if isinstance(attn_mask, torch.Tensor) else None)
        ctx.is_causal, ctx.scale = is_causal, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, mask = ctx.saved_tensors
        dq, dk, dv = attention_grads(q, k, v, out, grad_out, mask, ctx.is_causal, ctx.scale)
        return dq, dk, dv, None, None, None, None


def attention_grads(q, k, v, out, grad_out, attn_mask=None, is_causal=False, scale=None):
    """(dq, dk, dv) of softmax attention, each in its input's dtype, computed in fp32.

    q (B, Hq, T, D); k, v (B, Hk, S, D) with Hq a multiple of Hk (query head h reads key/value head h // (Hq/Hk));
    ``attn_mask`` bool (True attends) or additive, broadcast to (B, Hq, T, S); ``is_causal`` the top-left lower
    triangle. A query row that attends to nothing has output 0 (as SDPA's CPU kernels give) and no gradient.
    The query heads of one key/value head are stacked as one (G*T)-row block, so the key and value gradients
    sum over them inside the matmuls, with no copy of the keys per query head.
    """
    b, hq, t, d = q.shape
    hk, s_len = k.shape[-3], k.shape[-2]
    g = hq // hk
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qs = (q.float() * scale).reshape(b, hk, g * t, d)  # the scale folded into the queries once
    kf, vf = k.float(), v.float()
    s = torch.matmul(qs, kf.transpose(-1, -2)).view(b, hk, g, t, s_len)
    if is_causal:
        s = s.masked_fill(~torch.ones(t, s_len, dtype=torch.bool, device=s.device).tril(), -math.inf)
    if attn_mask is not None:
        mask = attn_mask
        if mask.dim() >= 3:  # (..., 1 or Hq, T, S) -> (..., 1 or Hk, 1 or G, T, S)
            heads = (1, 1) if mask.shape[-3] == 1 else (hk, g)
            mask = mask.reshape(*mask.shape[:-3], *heads, *mask.shape[-2:])
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask.float()
    p = torch.softmax(s, dim=-1).nan_to_num_(0.0).view(b, hk, g * t, s_len)  # a row of -inf only: NaN -> 0
    do = grad_out.float().reshape(b, hk, g * t, d)
    dv = torch.matmul(p.transpose(-1, -2), do)
    dp = torch.matmul(do, vf.transpose(-1, -2))
    # softmax's backward: dS = P (dP - rowsum(dO * O))
    ds = p * (dp - (do * out.float().reshape(b, hk, g * t, d)).sum(-1, keepdim=True))
    dq = torch.matmul(ds, kf).mul_(scale).view(b, hq, t, d)
    dk = torch.matmul(ds.transpose(-1, -2), qs)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def sdpa_matmul_backward(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                         enable_gqa=False):
    """``F.scaled_dot_product_attention`` with the matmul backward where it applies (see the module), else the
    plain call."""
    if not _applies(query, key, value, attn_mask, dropout_p):
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                              is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    # cast here as autocast would: the Function sees what SDPA computes
    q, k, v = (t.to(torch.bfloat16) for t in (query, key, value))
    return _SDPAMatmulBackward.apply(q, k, v, attn_mask, is_causal, scale, enable_gqa)


class _RouteSDPA(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:
            return sdpa_matmul_backward(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


def _checkpointed(model: torch.nn.Module) -> bool:
    if hasattr(model, "is_activation_checkpointing"):  # transformers >= 5.x (the older name warns there)
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))


def matmul_attention_backward(model: torch.nn.Module):
    """The context in which ``model``'s bf16 CPU attention calls take the matmul backward (a null context for a
    model without bf16 autocast, with activation checkpointing, or with the switch off)."""
    if (not enabled(MATMUL_ATTENTION_BACKWARD) or getattr(model, "rlplane_autocast_dtype", None) != torch.bfloat16
            or _checkpointed(model)):
        return contextlib.nullcontext()
    return _RouteSDPA()
