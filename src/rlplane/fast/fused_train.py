"""A fused training forward for the shared-prefix path (``policy.shared_prefix_forward``) of Llama-family models
(``llama``, ``mistral``, ``qwen2``): each distinct prompt once, then every row's response tokens attending to
its prompt's keys/values and its own.

The module stack of transformers does per layer three projections, a cache append (a copy of every prompt's
keys/values into every row, whose backward scatters them back) and a mask built per call. This forward runs the
same computation on the module's own weights, differentiably: fused q/k/v and gate/up matmuls, and each
prompt's keys/values read once by its G rows (GRPO's groups: one matmul per prompt instead of G copies). Under
bf16 autocast the matmuls run in bf16 as there. Logprobs and gradients equal the module stack's up to float
rounding (tests/unit/fast/test_fused_train.py). Plain twin: the model's own forward (``RLPLANE_FUSED_TRAIN=0``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlplane.fast.fused_decode import LLAMA_MODEL_TYPES, unsupported_reason
from rlplane.fast.switches import FUSED_TRAIN, enabled


def usable(model: torch.nn.Module) -> bool:
    """Whether :func:`prefix_logits` runs ``model`` (switch on, a plain Llama-family model, no attention dropout
    while training)."""
    config = getattr(model, "config", None)
    return (enabled(FUSED_TRAIN) and getattr(config, "model_type", None) in LLAMA_MODEL_TYPES
            and unsupported_reason(model) is None
            and not (model.training and getattr(config, "attention_dropout", 0.0)))


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _bias(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask: 0 where ``allowed``, the dtype's minimum elsewhere (as transformers' eager attention)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed,
                                                                                    torch.finfo(dtype).min)


def prefix_logits(model, prefix_ids: torch.Tensor, prefix_mask: torch.Tensor, row_to_unique: torch.Tensor,
                  resp_ids: torch.Tensor, resp_positions: torch.Tensor, resp_valid: torch.Tensor):
    """``(prompt_logits (U, P, V), response_logits (b, r, V))``: the prompts ``prefix_ids`` (U, P) right-padded
    (``prefix_mask`` (U, P), positions 0..P-1), and each row's ``resp_ids`` (b, r) at ``resp_positions`` after
    its prompt ``row_to_unique`` (b,) (``resp_valid`` (b, r) marks real tokens). As the model's forward on the
    prompts with a cache, then on the responses over it; call inside the model's autocast context."""
    inner, config = model.model, model.config
    attn0 = inner.layers[0].self_attn
    hq, hkv = config.num_attention_heads, config.num_key_value_heads
    d = getattr(config, "head_dim", None) or config.hidden_size // hq
    eps, scale = config.rms_norm_eps, attn0.scaling
    u, p = prefix_ids.shape
    b, r = resp_ids.shape
    device = prefix_ids.device
    groups = b // u if u and b % u == 0 else 0
    if not groups or not torch.equal(row_to_unique, torch.arange(u, device=device).repeat_interleave(groups)):
        groups = 0  # rows not in GRPO's grouped order: each row gets a copy of its prompt's keys/values

    positions = torch.arange(p, device=device)[None].expand(u, p)
    xp = inner.embed_tokens(prefix_ids)  # (U, P, H)
    xr = inner.embed_tokens(resp_ids)  # (b, r, H)
    cos_p, sin_p = (t[:, None] for t in inner.rotary_emb(xp, positions))  # (U, 1, P, D)
    cos_r, sin_r = (t[:, None] for t in inner.rotary_emb(xr, resp_positions))  # (b, 1, r, D)
    keep = prefix_mask.bool()
    prefix_bias = _bias(torch.ones(p, p, dtype=torch.bool, device=device).tril()[None] & keep[:, None, :],
                        xp.dtype)[:, None]  # (U, 1, P, P)
    own = torch.ones(r, r, dtype=torch.bool, device=device).tril()[None] & resp_valid.bool()[:, None, :]  # (b, r, r)
    resp_bias = _bias(torch.cat([keep[row_to_unique][:, None, :].expand(b, r, p), own], dim=-1),
                      xr.dtype)[:, None]  # (b, 1, r, P + r)

    def by_prompt(x):  # (b, h, r, X) -> (U, h, G * r, X)
        return x.reshape(u, groups, hq, r, x.shape[-1]).transpose(1, 2).reshape(u, hq, groups * r, x.shape[-1])

    def by_row(x):  # (U, h, G * r, X) -> (b, h, r, X)
        return x.reshape(u, hq, groups, r, x.shape[-1]).transpose(1, 2).reshape(b, hq, r, x.shape[-1])

    def heads(kv: torch.Tensor) -> torch.Tensor:  # (N, hkv, T, D) -> (N, hq, T, D): grouped-query attention
        return kv if hkv == hq else kv.repeat_interleave(hq // hkv, dim=1)

    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        w_qkv = torch.cat([m.weight for m in projections])
        b_qkv = None if all(m.bias is None for m in projections) else torch.cat(
            [m.bias if m.bias is not None else m.weight.new_zeros(m.out_features) for m in projections])

        def qkv(x, cos, sin):
            n, t = x.shape[:2]
            h = F.rms_norm(x, (x.shape[-1],), layer.input_layernorm.weight, eps)
            out = F.linear(h, w_qkv, b_qkv).view(n, t, hq + 2 * hkv, d).transpose(1, 2)
            q, k = _rope(out[:, :hq], cos, sin), _rope(out[:, hq: hq + hkv], cos, sin)
            return q, heads(k), heads(out[:, hq + hkv:])

        qp, kp, vp = qkv(xp, cos_p, sin_p)  # (U, hq, P, D)
        qr, kr, vr = qkv(xr, cos_r, sin_r)  # (b, hq, r, D)
        probs = (torch.matmul(qp, kp.transpose(-1, -2)) * scale + prefix_bias).softmax(-1, dtype=torch.float32)
        op = torch.matmul(probs.to(qp.dtype), vp)  # (U, hq, P, D)
        if groups:
            prompt_scores = by_row(torch.matmul(by_prompt(qr), kp.transpose(-1, -2)))  # (b, hq, r, P)
        else:
            kp_rows, vp_rows = kp.index_select(0, row_to_unique), vp.index_select(0, row_to_unique)
            prompt_scores = torch.matmul(qr, kp_rows.transpose(-1, -2))
        scores = torch.cat([prompt_scores, torch.matmul(qr, kr.transpose(-1, -2))], dim=-1)  # (b, hq, r, P + r)
        probs = (scores * scale + resp_bias).softmax(-1, dtype=torch.float32).to(qr.dtype)
        if groups:
            o_r = by_row(torch.matmul(by_prompt(probs[..., :p]), vp))
        else:
            o_r = torch.matmul(probs[..., :p], vp_rows)
        o_r = o_r + torch.matmul(probs[..., p:], vr)
        w_gu = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
        b_gu = None if mlp.gate_proj.bias is None else torch.cat([mlp.gate_proj.bias, mlp.up_proj.bias])

        def block(x, o):  # attention output, then the MLP, each added to the residual
            n, t = x.shape[:2]
            x = x + attn.o_proj(o.transpose(1, 2).reshape(n, t, hq * d))
            gate, up = F.linear(F.rms_norm(x, (x.shape[-1],), layer.post_attention_layernorm.weight, eps),
                                w_gu, b_gu).chunk(2, dim=-1)
            return x + mlp.down_proj(F.silu(gate) * up)

        xp, xr = block(xp, op), block(xr, o_r)
    head = model.get_output_embeddings()
    norm = inner.norm.weight
    return (head(F.rms_norm(xp, (xp.shape[-1],), norm, eps)), head(F.rms_norm(xr, (xr.shape[-1],), norm, eps)))
