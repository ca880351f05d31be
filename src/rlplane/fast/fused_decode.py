"""A fused decode forward for Llama-family models (``llama``, ``mistral``, ``qwen2``) in the ``hf`` backend;
Gemma 3 text models run a subclass of it (:mod:`rlplane.fast.gemma_decode`).

A decode step through transformers under bf16 autocast spends most of its time outside the matmuls. This
forward runs the same computation on the module's weights with explicit dtypes: fused qkv and gate/up
matrices (rebuilt on every weight change), fp32 residual and norms, each prompt's keys/values read once by
its G rows, fp32 attention over compute-dtype keys as SDPA sums them. fp32 logits match HF's to ~1e-5.
Plain twin: the model's own forward (``hf_decode: hf`` or ``RLPLANE_FUSED_DECODE=0``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlplane.fast.switches import ONEDNN_LINEAR, enabled
from rlplane.models.precision import FP32OutputLinear

LLAMA_MODEL_TYPES = ("llama", "mistral", "qwen2")
GEMMA_MODEL_TYPES = ("gemma3_text",)  # rlplane.fast.gemma_decode.Gemma3Decoder
SUPPORTED_MODEL_TYPES = LLAMA_MODEL_TYPES + GEMMA_MODEL_TYPES


def unsupported_reason(model: torch.nn.Module, capacity: int | None = None) -> str | None:
    """Why :class:`LlamaDecoder` cannot run ``model`` (for ``capacity`` positions), or None when it can."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {', '.join(SUPPORTED_MODEL_TYPES)}"
    if model_type in GEMMA_MODEL_TYPES:
        act = getattr(config, "hidden_activation", None)
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            return f"hidden_activation {act!r} (needs gelu_pytorch_tanh)"
        if getattr(config, "use_bidirectional_attention", False):
            return "bidirectional attention"
    elif getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} (needs silu)"
    elif "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        return "sliding-window attention layers"
    window = getattr(config, "sliding_window", None) if model_type == "mistral" else None
    if window is not None and (capacity is None or capacity > window):
        return f"sliding_window {window} shorter than the {capacity} positions of this generation"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "not a transformers *ForCausalLM with .model.layers and .model.rotary_emb"
    head = model.get_output_embeddings()
    if type(head) not in (torch.nn.Linear, FP32OutputLinear):
        return f"output projection is {type(head).__name__}, not a plain Linear"
    for i, layer in enumerate(inner.layers):
        attn, mlp = layer.self_attn, layer.mlp
        for name, mod in (("q_proj", attn.q_proj), ("k_proj", attn.k_proj), ("v_proj", attn.v_proj),
                          ("o_proj", attn.o_proj), ("gate_proj", mlp.gate_proj), ("up_proj", mlp.up_proj),
                          ("down_proj", mlp.down_proj)):
            if type(mod) is not torch.nn.Linear:  # a LoRA/quantized wrapper: the HF path runs it as it is
                return f"layer {i} {name} is {type(mod).__name__}, not a plain Linear"
    return None


def _cat_bias(mods: list[torch.nn.Linear], dtype: torch.dtype) -> torch.Tensor | None:
    """The concatenated biases of ``mods`` (zeros for those without one), or None when none has one."""
    if all(m.bias is None for m in mods):
        return None
    return torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.out_features) for m in mods]).to(dtype)


def _onednn_linear_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def output_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; fp32 on CPU through oneDNN's matmul (faster at the head's shape).
    Plain twin: ``F.linear`` (``RLPLANE_ONEDNN_LINEAR=0``)."""
    if (x.dtype == torch.float32 and x.device.type == "cpu" and enabled(ONEDNN_LINEAR)
            and _onednn_linear_available()):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class LlamaDecoder:
    """Prefill and one-token decode steps of a Llama-family ``model`` over a preallocated KV cache: the
    ``prefill``/``expand``/``decode``/``select`` interface of ``hf._HFStepper``."""

    def __init__(self, model: torch.nn.Module, capacity: int):
        self.model = model
        config = model.config
        self.capacity = capacity
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.eps = config.rms_norm_eps
        self.scaling = model.model.layers[0].self_attn.scaling
        param_dtype = model.model.embed_tokens.weight.dtype
        # The matmuls' dtype: rlplane's autocast dtype if set, else the weights'.
        self.dtype = getattr(model, "rlplane_autocast_dtype", None) or param_dtype
        # Prompt cache (layers, U, kv_heads, P, head_dim) and generated cache (layers, B, kv_heads, new, head_dim).
        self.prompt_keys = self.prompt_values = self.keys = self.values = None
        self.length = 0  # positions written
        self.load_weights()

    def load_weights(self) -> None:
        """(Re)build the fused matrices from the model's current parameters (after every weight change)."""
        dt = self.dtype
        self.layers = []
        for layer in self.model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
            self.layers.append(dict(
                ln1=layer.input_layernorm.weight, ln2=layer.post_attention_layernorm.weight,
                qkv=torch.cat([m.weight for m in qkv]).to(dt), qkv_bias=_cat_bias(qkv, dt),
                o=attn.o_proj.weight.to(dt), o_bias=None if attn.o_proj.bias is None else attn.o_proj.bias.to(dt),
                gate_up=torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).to(dt),
                gate_up_bias=_cat_bias([mlp.gate_proj, mlp.up_proj], dt),
                down=mlp.down_proj.weight.to(dt),
                down_bias=None if mlp.down_proj.bias is None else mlp.down_proj.bias.to(dt),
            ))
        head = self.model.get_output_embeddings()
        # fp32 logits when the model computes them in fp32 (FP32OutputLinear under bf16, or an fp32 model).
        self.head_dtype = head.weight.dtype if isinstance(head, FP32OutputLinear) else self.dtype
        self.head_weight = head.weight.to(self.head_dtype)
        self.head_bias = None if head.bias is None else head.bias.to(self.head_dtype)
        self.final_norm = self.model.model.norm.weight

    # ---- the loop's interface
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor):
        """(U, V) logits of each left-padded prompt's last position; fills the prompt cache."""
        u, p = input_ids.shape
        layers, hkv, d, device = len(self.layers), self.num_kv_heads, self.head_dim, input_ids.device
        # fp32 keys/values holding compute-dtype values: attention sums exact bf16 products in fp32 as SDPA.
        self.prompt_keys = torch.empty((layers, u, hkv, p, d), dtype=torch.float32, device=device)
        self.prompt_values = torch.empty((layers, u, hkv, p, d), dtype=torch.float32, device=device)
        self._new_rows(u)
        self.group_size = 1  # rows per prompt-cache row (see expand)
        self.pad = attention_mask == 0  # (U, P): True at left padding
        causal = torch.ones(p, p, dtype=torch.bool, device=device).tril()
        mask = (causal[None] & ~self.pad[:, None, :]) | torch.eye(p, dtype=torch.bool, device=device)
        self.length = 0
        with torch.autocast(device.type, enabled=False):  # explicit dtypes: no casts added
            hidden = self._forward(input_ids, position_ids, attn_mask=mask[:, None])  # (U, P, H)
            return self._logits(hidden[:, -1])

    def _new_rows(self, rows: int) -> None:
        """Allocate the generated tokens' cache for ``rows`` rows (before the first decode step)."""
        layers, hkv, d = len(self.layers), self.num_kv_heads, self.head_dim
        shape = (layers, rows, hkv, self.capacity - self.prompt_keys.shape[3], d)
        self.keys = torch.empty(shape, dtype=torch.float32, device=self.prompt_keys.device)
        self.values = torch.empty(shape, dtype=torch.float32, device=self.prompt_keys.device)

    def expand(self, index: torch.Tensor) -> None:
        """Batch rows from the prefilled prompts, ``index`` (B,); GRPO's ``[0]*G + [1]*G + ...`` shares each
        prompt's cache with its G rows (:meth:`_attend`), any other index copies it per row."""
        u, b = self.prompt_keys.shape[1], index.shape[0]
        grouped = torch.arange(u, device=index.device).repeat_interleave(b // u)
        if b % u == 0 and torch.equal(index, grouped):
            self.group_size = b // u
        else:
            self.prompt_keys = self.prompt_keys.index_select(1, index)
            self.prompt_values = self.prompt_values.index_select(1, index)
        self.pad = self.pad.index_select(0, index)
        self._new_rows(b)

    def select(self, index: torch.Tensor) -> None:
        """Keep (and reorder) the rows by ``index`` (B',) long: one copy of the cache (per row from then on)."""
        prompt_rows = torch.div(index, self.group_size, rounding_mode="floor")
        self.prompt_keys = self.prompt_keys.index_select(1, prompt_rows)
        self.prompt_values = self.prompt_values.index_select(1, prompt_rows)
        self.group_size = 1
        self.keys, self.values = self.keys.index_select(1, index), self.values.index_select(1, index)
        self.pad = self.pad.index_select(0, index)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, attention_mask=None) -> torch.Tensor:
        """(b, V) next-token logits after ``tokens`` (b,) at ``positions`` (b,); ``attention_mask`` unused."""
        with torch.autocast(tokens.device.type, enabled=False):
            hidden = self._forward(tokens[:, None], positions[:, None], attn_mask=None)
            return self._logits(hidden[:, -1])

    # ---- the model
    def _attend(self, i: int, q: torch.Tensor, n: int, bias: torch.Tensor) -> torch.Tensor:
        """Layer ``i``'s one-token attention, q (B, kv_heads, g, D) -> same, over P prompt + ``n`` generated positions.

        Softmax in fp32 with ``bias`` masking left padding; each prompt's part is one matmul for its G rows.
        """
        b, hkv, g, d = q.shape
        u, p, gs = self.prompt_keys.shape[1], self.prompt_keys.shape[3], self.group_size

        def by_prompt(x):  # (B, kv, g, X) -> (U, kv, G * g, X)
            return x.reshape(u, gs, hkv, g, x.shape[-1]).transpose(1, 2).reshape(u, hkv, gs * g, x.shape[-1])

        def by_row(x):  # (U, kv, G * g, X) -> (B, kv, g, X)
            return x.reshape(u, hkv, gs, g, x.shape[-1]).transpose(1, 2).reshape(b, hkv, g, x.shape[-1])

        q = q.float()
        prompt_scores = by_row(torch.matmul(by_prompt(q), self.prompt_keys[i].transpose(-1, -2)))  # (B, kv, g, P)
        new_scores = torch.matmul(q, self.keys[i, :, :, :n].transpose(-1, -2))  # (B, kv, g, n)
        probs = (torch.cat([prompt_scores, new_scores], dim=-1) * self.scaling + bias).softmax(-1)  # fp32
        out = by_row(torch.matmul(by_prompt(probs[..., :p]), self.prompt_values[i]))
        return (out + torch.matmul(probs[..., p:], self.values[i, :, :, :n])).to(self.dtype)  # (B, kv, g, D)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(b, H) fp32 residual -> (b, V) logits, in the head's dtype (fp32 with FP32OutputLinear)."""
        x = F.rms_norm(hidden, (hidden.shape[-1],), self.final_norm, self.eps).to(self.head_dtype)
        return output_linear(x, self.head_weight, self.head_bias)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        """The decoder stack on ``ids`` (B, T) at ``positions``; writes the cache at ``[length, length + T)``.
        ``attn_mask``: (B, 1, T, length + T) bool for a prefill, None for a decode step."""
        b = ids.shape[0]
        start, end = self.length, self.length + ids.shape[1]
        residual = self.model.model.embed_tokens(ids).float()  # (B, T, H) fp32 as under autocast
        # cos/sin (B, T, D) for all layers, from the model's own rotary module.
        cos, sin = self.model.model.rotary_emb(residual, positions)
        cos, sin = cos.float()[:, None], sin.float()[:, None]  # (B, 1, T, D)
        bias = None
        if attn_mask is None:
            # Additive fp32 bias (B, 1, 1, end): -inf at the left padding.
            bias = torch.zeros((b, 1, 1, end), dtype=torch.float32, device=ids.device)
            bias[..., : self.pad.shape[1]].masked_fill_(self.pad[:, None, None], float("-inf"))
        return self._layers(residual, cos, sin, start, end, attn_mask, bias)

    def _layers(self, residual, cos, sin, start: int, end: int, attn_mask, bias):
        """The decoder layers (see :meth:`_forward`)."""
        b, t = residual.shape[:2]
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        for i, w in enumerate(self.layers):
            x = F.rms_norm(residual, (residual.shape[-1],), w["ln1"], self.eps).to(self.dtype)
            qkv = F.linear(x, w["qkv"], w["qkv_bias"]).view(b, t, hq + 2 * hkv, d).transpose(1, 2)  # (B, hq+2hkv, T, D)
            # Rotary on q and k together, in fp32 as HF under autocast.
            qk = qkv[:, : hq + hkv].float()
            half = d // 2
            rotated = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
            qk = (qk * cos + rotated * sin).to(self.dtype)
            if attn_mask is None:
                # Write this token's key/value, then attend over prompt + generated.
                n = end - self.prompt_keys.shape[3]  # generated positions, this one included
                self.keys[i, :, :, n - 1] = qk[:, hq:, 0]
                self.values[i, :, :, n - 1] = qkv[:, hq + hkv :, 0]  # compute-dtype values, stored in fp32
                q = qk[:, :hq, 0].reshape(b, hkv, hq // hkv, d)  # heads grouped by their key head
                attn = self._attend(i, q, n, bias).reshape(b, 1, hq * d)
            else:  # prefill: the prompt's keys/values are the whole cache
                self.prompt_keys[i] = qk[:, hq:]
                self.prompt_values[i] = qkv[:, hq + hkv :]
                attn = F.scaled_dot_product_attention(qk[:, :hq], qk[:, hq:], qkv[:, hq + hkv :], attn_mask=attn_mask,
                                                      scale=self.scaling, enable_gqa=hq != hkv)  # (B, hq, T, D)
                attn = attn.transpose(1, 2).reshape(b, t, hq * d)
            residual = residual + F.linear(attn, w["o"], w["o_bias"])
            x = F.rms_norm(residual, (residual.shape[-1],), w["ln2"], self.eps).to(self.dtype)
            gate, up = F.linear(x, w["gate_up"], w["gate_up_bias"]).chunk(2, dim=-1)
            residual = residual + F.linear(F.silu(gate) * up, w["down"], w["down_bias"])
        self.length = end
        return residual
