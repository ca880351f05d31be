"""A decode step of fixed shapes for Llama-family models (``llama``, ``mistral``, ``qwen2``), captured as a CUDA
graph per batch bucket on CUDA and replayed once per token.

On a GPU a small model's decode step is bound by kernel launches (one per op, some 600 for SmolLM2's 30 layers),
not by arithmetic. Here every step of a generation has the same shapes, so one capture serves every token:

- **Batch buckets** (:func:`batch_bucket`): the running rows are padded up to a power of two (multiples of 256
  past 256). Padding rows decode token 0 at position 0 and see cache slot 0 only: finite, never read back.
- **A static KV cache** ``(layers, rows, kv_heads, slots, head_dim)`` in the compute dtype, allocated for the
  largest bucket and capacity block (:func:`capacity_block`) seen; prompt keys/values at slots ``[0, P)`` (left
  padded), the k-th generated token's at ``P + k``. Attention runs over the whole block under a mask (a row
  sees slots from its first real prompt token to the current one), the write slot is a tensor, rotary angles
  come from a table. The cache grows, and every graph is dropped, when a generation needs more of either.
- **Its own weights**: the fused matrices of :class:`~rlplane.fast.fused_decode.LlamaDecoder` plus the embedding,
  norms and head, copied into buffers this decoder owns (``copy_`` at every generation and at an in-flight
  weight swap). A captured graph reads those addresses only, so it stays valid whether a refit copies into the
  model's parameters in place or replaces them (``sleep``/wake, ``load_state_dict(assign=True)``).
- The prefill runs eagerly (:class:`LlamaDecoder`'s), then each row's prompt keys/values are copied into its
  cache rows. Sampling stays outside the graph: the ``hf`` loop samples from the returned logits with its
  seeded sampler, as for every decoder, so tokens and logprobs keep that contract.

Attention is ``F.scaled_dot_product_attention`` on compute-dtype keys/values (as the model's own SDPA forward),
the query heads of one key head as its query rows. Plain twin: :class:`LlamaDecoder` (``RLPLANE_CUDA_GRAPH_DECODE=0``
or ``hf_decode: fused``); on a CPU the same step runs eagerly (``hf_decode: graph``), which is how its parity with
the twin is tested. Capture itself needs CUDA (:func:`capture_unavailable`).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from rlplane.fast.fused_decode import LLAMA_MODEL_TYPES, LlamaDecoder, unsupported_reason
from rlplane.fast.switches import CUDA_GRAPH_DECODE

# Capacity is rounded up to a multiple of this (graphs are kept per (bucket, block)).
CAPACITY_BLOCK = 64
# Past this many rows the buckets are its multiples (below: powers of two).
_LARGE_BUCKET = 256
# Eager steps on a side stream before a capture (cuBLAS handles and workspaces are made outside the graph).
_WARMUP_STEPS = 2


def batch_bucket(rows: int) -> int:
    """The batch size a step of ``rows`` rows runs at: the next power of two up to 256, else the next multiple
    of 256 (at most a quarter of a large batch is padding, a few captures cover a run)."""
    if rows < 1:
        raise ValueError(f"batch_bucket: {rows} rows; a decode step needs at least one")
    if rows <= _LARGE_BUCKET:
        return 1 << (rows - 1).bit_length()
    return -(-rows // _LARGE_BUCKET) * _LARGE_BUCKET


def capacity_block(positions: int) -> int:
    """``positions`` rounded up to a multiple of :data:`CAPACITY_BLOCK`: the slots a generation attends over."""
    return -(-positions // CAPACITY_BLOCK) * CAPACITY_BLOCK


def capture_unavailable(device: torch.device | str) -> str | None:
    """Why a decode step on ``device`` cannot be captured as a CUDA graph, or None when it can."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"the model is on {device.type}; CUDA graphs need a CUDA device"
    if not torch.cuda.is_available():
        return "this process sees no CUDA device"
    return None


def graph_unsupported_reason(model: torch.nn.Module, capacity: int | None = None) -> str | None:
    """Why :class:`StaticDecoder` cannot run ``model`` (for ``capacity`` positions), or None when it can."""
    reason = unsupported_reason(model, capacity)
    if reason is not None:
        return reason
    model_type = model.config.model_type
    if model_type not in LLAMA_MODEL_TYPES:
        return f"model_type {model_type!r} (the static decoder runs {', '.join(LLAMA_MODEL_TYPES)})"
    if type(model.model.embed_tokens) is not torch.nn.Embedding:
        return f"embedding is {type(model.model.embed_tokens).__name__}, not a plain Embedding"
    rope = getattr(model.model.rotary_emb, "rope_type", "default")
    if rope in ("dynamic", "longrope"):  # their angles depend on the sequence's length: no fixed table
        return f"rope_type {rope!r}"
    return None


class StaticDecoder(LlamaDecoder):
    """:class:`LlamaDecoder`'s loop interface (``prefill``/``expand``/``decode``/``select``) over a static cache,
    kept between generations: call :meth:`begin` before each. ``capture``: replay CUDA graphs (CUDA only);
    else the same step runs eagerly. ``captures`` counts the graphs captured."""

    def __init__(self, model: torch.nn.Module, capture: bool):
        device = model.model.embed_tokens.weight.device
        if capture and (reason := capture_unavailable(device)) is not None:
            raise ValueError(f"StaticDecoder(capture=True): {reason}; use capture=False to run its step eagerly")
        self.capture = capture
        self.device = device
        self._owned: dict[str, torch.Tensor] = {}  # this decoder's copies of the weights, by name
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}  # (bucket, block)
        self._pool = torch.cuda.graph_pool_handle() if capture else None  # shared: graphs replay one at a time
        self.captures = 0
        self.cache_k = self.cache_v = None  # (layers, rows, kv_heads, slots, head_dim)
        self.block = 0  # slots this generation attends over
        self.rows = self.bucket = 0  # running rows, and the bucket they run at
        self._index: torch.Tensor | None = None  # prompt of each row, until the cache rows are filled
        super().__init__(model, capacity=0)

    # ---- weights
    def load_weights(self) -> None:
        """Copy the model's current weights into this decoder's buffers (fused as :class:`LlamaDecoder` fuses)."""
        super().load_weights()  # fresh tensors, some of them the model's own parameters
        embed = self.model.model.embed_tokens.weight
        tied = self.head_weight.data_ptr() == embed.data_ptr() and self.head_weight.dtype == embed.dtype
        fresh = {"embed": embed, "final_norm": self.final_norm, "head_bias": self.head_bias,
                 "head_weight": None if tied else self.head_weight}
        fresh.update({f"{i}.{k}": v for i, w in enumerate(self.layers) for k, v in w.items()})
        for name, value in fresh.items():
            if value is None:
                continue
            held = self._owned.get(name)
            if held is not None and held.shape == value.shape and held.dtype == value.dtype:
                held.copy_(value)
            else:  # first load (or a changed shape/dtype): new addresses, so no graph may survive
                self._owned[name] = value.detach().clone()
                self._graphs.clear()
        own = self._owned
        self.embed = own["embed"]
        self.final_norm = own["final_norm"]
        self.head_weight = own["embed"] if tied else own["head_weight"]
        self.head_bias = own.get("head_bias")
        self.layers = [{k: (None if v is None else own[f"{i}.{k}"]) for k, v in w.items()}
                       for i, w in enumerate(self.layers)]

    def begin(self, capacity: int) -> None:
        """Before a generation of at most ``capacity`` positions (prompt + new): the model's current weights, the
        capacity block its steps attend over."""
        self.load_weights()
        self.capacity, self.block = capacity, capacity_block(capacity)
        self.length, self.rows, self.bucket, self._index = 0, 0, 0, None
        self.prompt_keys = self.prompt_values = None

    # ---- the loop's interface (prefill is LlamaDecoder's: the prompt cache, then the rows' cache here)
    def _new_rows(self, rows: int) -> None:
        """No per-generation cache: rows are copied into the static one at the first decode step."""

    def expand(self, index: torch.Tensor) -> None:
        """Batch rows from the prefilled prompts, ``index`` (B,): the prompt of each row."""
        self._index = index

    def select(self, index: torch.Tensor) -> None:
        """Keep (and reorder) the running rows by ``index`` (B',) long: moved to the cache's first B' rows."""
        if self.prompt_keys is not None:  # before the first decode step: only the rows' prompts change
            self._index = index if self._index is None else self._index[index]
            return
        n = index.shape[0]
        for cache in (self.cache_k, self.cache_v):
            for layer in cache:  # one layer at a time: a copy of one layer's kept rows at most
                layer[:n, :, : self.block] = layer[index, :, : self.block]
        self.start[:n] = self.start[index]
        self._pad_rows(n)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, attention_mask=None) -> torch.Tensor:
        """(b, V) next-token logits after ``tokens`` (b,) at ``positions`` (b,); ``attention_mask`` unused (the
        step builds its own from each row's first prompt slot)."""
        with torch.autocast(self.device.type, enabled=False):  # explicit dtypes: no casts added
            if self.prompt_keys is not None:
                self._fill_rows()
            if tokens.shape[0] != self.rows:
                raise ValueError(f"decode: {tokens.shape[0]} tokens for {self.rows} running rows (select() first)")
            self.tokens[: self.rows] = tokens
            self.positions[: self.rows] = positions
            self.slot.fill_(self.length)
            logits = self._replay() if self.capture else self._step(self.bucket, self.block)
        self.length += 1
        return logits[: self.rows]

    # ---- the static cache
    def _fill_rows(self) -> None:
        """Copy each row's prompt keys/values into its cache rows (first decode step of a generation)."""
        u, p = self.prompt_keys.shape[1], self.prompt_keys.shape[3]
        index = self._index if self._index is not None else torch.arange(u, device=self.device)
        rows, bucket = index.shape[0], batch_bucket(index.shape[0])
        self._ensure_cache(bucket, self.block)
        for cache, prompt in ((self.cache_k, self.prompt_keys), (self.cache_v, self.prompt_values)):
            # Zeroed first: slots not yet written hold finite values whatever ran before (masked, never NaN).
            cache[:, :bucket, :, : self.block].zero_()
            cache[:, :rows, :, :p] = prompt.index_select(1, index).to(cache.dtype)  # compute-dtype values
        self.start[:rows] = self.pad.sum(-1).index_select(0, index)  # left padding: the first real slot
        self._pad_rows(rows)
        self.prompt_keys = self.prompt_values = self.pad = self._index = None

    def _pad_rows(self, rows: int) -> None:
        """``rows`` running rows, the rest of their bucket padding: token 0 at position 0, seeing slot 0."""
        self.rows, self.bucket = rows, batch_bucket(rows)
        self.start[rows:] = 0
        self.tokens[rows:] = 0
        self.positions[rows:] = 0

    def _ensure_cache(self, bucket: int, block: int) -> None:
        """A cache (and step inputs) of at least ``bucket`` rows and ``block`` slots; growing it drops the graphs."""
        if self.cache_k is not None and bucket <= self.cache_k.shape[1] and block <= self.cache_k.shape[3]:
            return
        rows = max(bucket, 0 if self.cache_k is None else self.cache_k.shape[1])
        slots = max(block, 0 if self.cache_k is None else self.cache_k.shape[3])
        self._graphs.clear()
        self.cache_k = self.cache_v = None  # freed before the larger one is allocated
        shape = (len(self.layers), rows, self.num_kv_heads, slots, self.head_dim)
        self.cache_k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.cache_v = torch.zeros(shape, dtype=self.dtype, device=self.device)
        long = dict(dtype=torch.long, device=self.device)
        self.tokens, self.positions, self.start = (torch.zeros(rows, **long) for _ in range(3))
        self.slot = torch.zeros(1, **long)  # the slot this step writes (P + k)
        self.slot_ids = torch.arange(slots, **long)
        # Rotary angles of every position from the model's own module (its scaling included): (slots, D) fp32.
        cos, sin = self.model.model.rotary_emb(torch.zeros(1, device=self.device), self.slot_ids[None])
        self.cos, self.sin = cos[0].float(), sin[0].float()

    # ---- the step
    def _step(self, bucket: int, block: int) -> torch.Tensor:
        """One decode step of the first ``bucket`` rows over ``block`` slots: reads the step inputs, writes this
        token's keys/values at ``slot``, returns (bucket, V) logits. No host synchronisation (capturable)."""
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        positions = self.positions[:bucket]
        residual = F.embedding(self.tokens[:bucket], self.embed).float()  # (b, H) fp32 as under autocast
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # (b, 1, D)
        slots = self.slot_ids[:block]
        seen = (slots[None] >= self.start[:bucket, None]) & (slots[None] <= self.slot)  # (b, block)
        seen = seen[:, None, None]  # (b, 1, 1, block): every query head of a row
        for i, w in enumerate(self.layers):
            x = F.rms_norm(residual, (residual.shape[-1],), w["ln1"], self.eps).to(self.dtype)
            qkv = F.linear(x, w["qkv"], w["qkv_bias"]).view(bucket, hq + 2 * hkv, d)
            qk = qkv[:, : hq + hkv].float()  # rotary in fp32, as LlamaDecoder and HF under autocast
            half = d // 2
            qk = (qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), dim=-1) * sin).to(self.dtype)
            keys, values = self.cache_k[i, :bucket, :, :block], self.cache_v[i, :bucket, :, :block]
            keys.index_copy_(2, self.slot, qk[:, hq:, None])  # (b, kv, 1, D) at this step's slot
            values.index_copy_(2, self.slot, qkv[:, hq + hkv :, None])
            q = qk[:, :hq].reshape(bucket, hkv, hq // hkv, d)  # a key head's query heads as its query rows
            with _attention_kernels(self.device):
                attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=seen, scale=self.scaling)
            residual = residual + F.linear(attn.reshape(bucket, hq * d), w["o"], w["o_bias"])
            x = F.rms_norm(residual, (residual.shape[-1],), w["ln2"], self.eps).to(self.dtype)
            gate, up = F.linear(x, w["gate_up"], w["gate_up_bias"]).chunk(2, dim=-1)
            residual = residual + F.linear(F.silu(gate) * up, w["down"], w["down_bias"])
        return self._logits(residual)

    def _replay(self) -> torch.Tensor:
        """This step through the graph of the current (bucket, block), captured on its first use."""
        key = (self.bucket, self.block)
        if key not in self._graphs:
            self._graphs[key] = self._capture(*key)
            self.captures += 1
        graph, logits = self._graphs[key]
        graph.replay()
        return logits

    def _capture(self, bucket: int, block: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Capture :meth:`_step` at (``bucket``, ``block``) into the pool all of this decoder's graphs share (they
        replay one at a time and each one's logits are read before the next replay). The warm-up steps write the
        same keys/values at the same slot as the replay will: harmless."""
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.stream(side):
                for _ in range(_WARMUP_STEPS):
                    self._step(bucket, block)
            current.wait_stream(side)
            # thread_local: another thread of this process (a trainer beside an async collector) may use CUDA.
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                logits = self._step(bucket, block)
        except RuntimeError as e:
            raise RuntimeError(f"capturing the decode step as a CUDA graph (batch {bucket}, {block} slots) failed: "
                               f"{e}; set {CUDA_GRAPH_DECODE}=0 or policy.generation.hf_decode=fused to decode "
                               "without graphs") from e
        return graph, logits


def _attention_kernels(device: torch.device):
    """On CUDA, SDPA's memory-efficient kernel (masks, fp32 accumulation) or its math fallback, both capturable;
    elsewhere SDPA's own choice."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
