"""The fused decode forward for Gemma 3 text models (``gemma3_text``) on :class:`LlamaDecoder`'s cache and loop.

Gemma 3's additions, as transformers computes them: embeddings scaled by sqrt(hidden) (the model's own module),
``1 + weight`` RMSNorms before and after attention and MLP (post-norms round to the compute dtype), query/key
norms, sliding-window layers (key index ``j`` seen from query ``i`` when ``i - j < sliding_window``; their own
rotary base), a tanh-GELU MLP, ``final_logit_softcapping``. Plain twin: the model's own forward; parity:
``tests/unit/fast/test_gemma_decode.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlplane.fast.fused_decode import LlamaDecoder, output_linear

SLIDING = "sliding_attention"


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm in fp32 (scale ``1 + weight``); the caller picks the output dtype."""
    return F.rms_norm(x.float(), (x.shape[-1],), weight, eps)


class Gemma3Decoder(LlamaDecoder):
    """:class:`LlamaDecoder`'s interface (prefill, expand, decode, select) for a ``Gemma3ForCausalLM``."""

    def __init__(self, model: torch.nn.Module, capacity: int):
        config = model.config
        self.layer_types = list(config.layer_types)
        self.window = config.sliding_window
        self.softcap = getattr(config, "final_logit_softcapping", None)
        super().__init__(model, capacity)

    def load_weights(self) -> None:
        super().load_weights()
        for layer, w in zip(self.model.model.layers, self.layers):
            attn = layer.self_attn
            w.update(ln1=1.0 + layer.input_layernorm.weight.float(),
                     ln_post_attn=1.0 + layer.post_attention_layernorm.weight.float(),
                     ln2=1.0 + layer.pre_feedforward_layernorm.weight.float(),
                     ln_post_mlp=1.0 + layer.post_feedforward_layernorm.weight.float(),
                     q_norm=1.0 + attn.q_norm.weight.float(), k_norm=1.0 + attn.k_norm.weight.float())
        self.final_norm = 1.0 + self.model.model.norm.weight.float()

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = output_linear(_norm(hidden, self.final_norm, self.eps).to(self.head_dtype),
                               self.head_weight, self.head_bias)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        b = ids.shape[0]
        end = self.length + ids.shape[1]
        residual = self.model.model.embed_tokens(ids).float()  # scaled by sqrt(hidden) in the module
        rope = {}
        for kind in set(self.layer_types):  # each layer kind has its own rotary base
            cos, sin = self.model.model.rotary_emb(residual, positions, kind)
            rope[kind] = (cos.float()[:, None], sin.float()[:, None])  # (B, 1, T, D)
        masks = {"full_attention": (attn_mask, None)}
        if attn_mask is None:  # decode: additive bias over [0, end), -inf at the left padding
            bias = torch.zeros((b, 1, 1, end), dtype=torch.float32, device=ids.device)
            bias[..., : self.pad.shape[1]].masked_fill_(self.pad[:, None, None], float("-inf"))
            local = bias.clone()
            local[..., : max(0, end - self.window)] = float("-inf")  # keys at index <= query - window
            masks = {"full_attention": (None, bias), SLIDING: (None, local)}
        else:  # prefill: keys within the window before each query (its own position always kept)
            t = ids.shape[1]
            i = torch.arange(t, device=ids.device)
            near = (i[:, None] - i[None, :]) < self.window
            masks[SLIDING] = (attn_mask & near | torch.eye(t, dtype=torch.bool, device=ids.device), None)
        return self._gemma_layers(residual, rope, masks, end)

    def _gemma_layers(self, residual, rope, masks, end: int) -> torch.Tensor:
        b, t = residual.shape[:2]
        hq, hkv, d, dt = self.num_heads, self.num_kv_heads, self.head_dim, self.dtype
        for i, (w, kind) in enumerate(zip(self.layers, self.layer_types)):
            cos, sin = rope[kind]
            attn_mask, bias = masks[kind]
            x = _norm(residual, w["ln1"], self.eps).to(dt)
            qkv = F.linear(x, w["qkv"], w["qkv_bias"]).view(b, t, hq + 2 * hkv, d).transpose(1, 2)
            q = _norm(qkv[:, :hq], w["q_norm"], self.eps).to(dt)
            k = _norm(qkv[:, hq: hq + hkv], w["k_norm"], self.eps).to(dt)
            qk = torch.cat([q, k], dim=1).float()
            half = d // 2
            qk = (qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), dim=-1) * sin).to(dt)
            v = qkv[:, hq + hkv:]
            if attn_mask is None:
                n = end - self.prompt_keys.shape[3]
                self.keys[i, :, :, n - 1] = qk[:, hq:, 0]
                self.values[i, :, :, n - 1] = v[:, :, 0]
                attn = self._attend(i, qk[:, :hq, 0].reshape(b, hkv, hq // hkv, d), n, bias).reshape(b, 1, hq * d)
            else:
                self.prompt_keys[i] = qk[:, hq:]
                self.prompt_values[i] = v
                attn = F.scaled_dot_product_attention(qk[:, :hq], qk[:, hq:], v, attn_mask=attn_mask,
                                                      scale=self.scaling, enable_gqa=hq != hkv)
                attn = attn.transpose(1, 2).reshape(b, t, hq * d)
            out = F.linear(attn, w["o"], w["o_bias"])
            residual = residual + _norm(out, w["ln_post_attn"], self.eps).to(out.dtype)
            x = _norm(residual, w["ln2"], self.eps).to(dt)
            gate, up = F.linear(x, w["gate_up"], w["gate_up_bias"]).chunk(2, dim=-1)
            out = F.linear(F.gelu(gate, approximate="tanh") * up, w["down"], w["down_bias"])
            residual = residual + _norm(out, w["ln_post_mlp"], self.eps).to(out.dtype)
        self.length = end
        return residual
