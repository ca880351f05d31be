"""Logit processing and sampling, shared by the generation backends and the trainer's logprobs.

Temperature, top-k, top-p (as transformers and vLLM), filtered tokens ``-inf``; :func:`sampling_logprobs` is
the one place that distribution is computed. Each row's token is drawn with a uniform hashed from
``(row seed, position)``, the row seed from ``(run seed, sample key, weight version)``.
"""

from __future__ import annotations

import hashlib

import torch

# Rows of the (N, V) logits whose top-p mask is computed at once (bounds the sort's memory).
_MASK_CHUNK_ROWS = 256
# Tokens per block of the two-level cdf search (inverse_cdf_sample).
_CDF_BLOCK = 256


def filtering_on(top_k: int | None, top_p: float) -> bool:
    """Whether top-k or top-p removes any token (``top_k`` 0/None and ``top_p`` 1 switch them off)."""
    return bool(top_k) or top_p < 1.0


@torch.no_grad()
def _top_k_drop(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """True where a logit is below the k-th largest of its row (ties at the k-th value are kept)."""
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (..., 1)
    return logits < kth


@torch.no_grad()
def _top_p_drop(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """True outside each row's nucleus: dropped once the mass before a token reaches ``top_p`` (the top one kept)."""
    shape = logits.shape
    flat = logits.reshape(-1, shape[-1])  # (N, V)
    drop = torch.empty(flat.shape, dtype=torch.bool, device=flat.device)
    for start in range(0, flat.shape[0], _MASK_CHUNK_ROWS):
        rows = flat[start : start + _MASK_CHUNK_ROWS]
        sorted_logits, sorted_idx = torch.sort(rows, dim=-1, descending=True)  # (n, V)
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # (n, V) exclusive cumulative mass
        drop_sorted = mass_before >= top_p
        drop_sorted[..., 0] = False
        drop[start : start + _MASK_CHUNK_ROWS] = torch.zeros_like(drop_sorted).scatter_(-1, sorted_idx, drop_sorted)
    return drop.reshape(shape)


def apply_top_k(logits: torch.Tensor, top_k: int | None) -> torch.Tensor:
    """Keep the ``top_k`` largest logits per row (ties at the k-th value are kept). (..., V) -> (..., V)."""
    if not top_k or top_k >= logits.shape[-1]:
        return logits
    return logits.masked_fill(_top_k_drop(logits, top_k), float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filter (:func:`_top_p_drop`): (..., V) -> (..., V)."""
    if top_p >= 1.0:
        return logits
    return logits.masked_fill(_top_p_drop(logits, top_p), float("-inf"))


def process_logits(
    logits: torch.Tensor,
    temperature: float,
    top_k: int | None,
    top_p: float,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """``logits / temperature`` then top-k then top-p, (..., V) -> (..., V); ``keep`` (...,) tokens stay unfiltered."""
    if temperature <= 0:
        raise ValueError(f"temperature = {temperature}: must be > 0; use greedy=True for argmax decoding")
    if temperature != 1.0:
        logits = logits / temperature
    if not filtering_on(top_k, top_p):
        return logits
    with torch.no_grad():
        drop = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)  # (..., V)
        if top_k and top_k < logits.shape[-1]:
            drop |= _top_k_drop(logits, top_k)
        if top_p < 1.0:
            # top-p sees the distribution left after top-k (renormalised over the top-k tokens).
            drop |= _top_p_drop(logits.masked_fill(drop, float("-inf")), top_p)
        if keep is not None:
            drop.scatter_(-1, keep[..., None], False)
    return logits.masked_fill(drop, float("-inf"))


def sampling_logprobs(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_k: int | None,
    top_p: float,
    tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """``log_softmax(process_logits(logits))``: (..., V) float32, or with ``tokens`` (...,) their logprobs
    (each kept in the set, so rounding at a top-p boundary never gives ``-inf``)."""
    processed = process_logits(logits.float(), temperature, top_k, top_p, keep=tokens)
    logprobs = processed.log_softmax(dim=-1)  # (..., V)
    if tokens is None:
        return logprobs
    return logprobs.gather(-1, tokens[..., None]).squeeze(-1)

# ---- counter-based randomness: splitmix64 (Steele, Lea & Flood 2014) in int64 with logical right shifts.
_GOLDEN = 0x9E3779B97F4A7C15 - 2**64
_MIX1 = 0xBF58476D1CE4E5B9 - 2**64
_MIX2 = 0x94D049BB133111EB - 2**64


def _shift_right(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """The splitmix64 output for state ``x`` (int64 bit patterns, any shape): a bijective 64-bit mix."""
    x = x + _GOLDEN
    x = (x ^ _shift_right(x, 30)) * _MIX1
    x = (x ^ _shift_right(x, 27)) * _MIX2
    return x ^ _shift_right(x, 31)


def counter_uniforms(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """One uniform in [0, 1) per row from ``(seed, counter)`` (B,) int64: two splitmix64 rounds, top 53 bits."""
    h = splitmix64(seeds ^ splitmix64(counters))
    return _shift_right(h, 11).double() * 2.0**-53


def sample_seed(run_seed: int, key: str, weight_version: int) -> int:
    """The int64 seed of one sample: blake2b of run seed, key and weight version (``hash`` is salted)."""
    digest = hashlib.blake2b(f"{run_seed}\x1f{key}\x1f{weight_version}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def inverse_cdf_sample(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The token whose cdf interval holds ``u · total`` per row: probs (B, V) >= 0, uniforms (B,) -> (B,) long.

    Token j is drawn with probability ``p_j / total``, never at zero mass. Two levels (block cdf, then the
    cdf inside the block) avoid a float64 cdf of the whole vocabulary.
    """
    b, v = probs.shape
    if v <= 2 * _CDF_BLOCK:
        return _inverse_cdf_flat(probs, uniforms)
    n_blocks = -(-v // _CDF_BLOCK)
    # Zero mass past V.
    padded = probs if v % _CDF_BLOCK == 0 else torch.nn.functional.pad(probs, (0, n_blocks * _CDF_BLOCK - v))
    blocks = padded.view(b, n_blocks, _CDF_BLOCK)
    # Block masses in float32: error ~1e-7 of a block's mass, not accumulated (the block cdf is float64).
    block_cdf = blocks.sum(dim=-1).double().cumsum(dim=-1)  # (B, n_blocks)
    target = (uniforms.double() * block_cdf[:, -1])[:, None]  # (B, 1)
    # First block whose cdf passes the target.
    block = torch.searchsorted(block_cdf, target, right=True).squeeze(-1).clamp_(max=n_blocks - 1)  # (B,)
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)[:, None]).squeeze(-1), 0.0)
    rows = torch.arange(b, device=probs.device)
    inner_cdf = blocks[rows, block].cumsum(dim=-1, dtype=torch.float64) + before[:, None]  # (B, _CDF_BLOCK)
    tokens = block * _CDF_BLOCK + torch.searchsorted(inner_cdf, target, right=True).squeeze(-1)
    # Past its block (rounding): the last token with mass up to the block's end, as _inverse_cdf_flat.
    over = tokens >= (block + 1) * _CDF_BLOCK
    for r in over.nonzero().flatten().tolist():
        end = min(v, (int(block[r]) + 1) * _CDF_BLOCK)
        tokens[r] = int((probs[r, :end] > 0).nonzero().max()) if bool((probs[r, :end] > 0).any()) else end - 1
    return tokens


def _inverse_cdf_flat(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """:func:`inverse_cdf_sample` with one float64 cdf over the whole row (small vocabularies; its reference)."""
    cdf = probs.cumsum(dim=-1, dtype=torch.float64)  # (B, V); converting inside the cumsum saves a pass
    target = (uniforms.double() * cdf[:, -1])[:, None]  # (B, 1)
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(-1)  # first j with cdf_j > target
    # u · total can round up to total (tokens == V): fall back on the last token with mass.
    over = tokens >= probs.shape[-1]
    if bool(over.any()):
        tokens[over] = probs.shape[-1] - 1 - (probs[over] > 0).flip(-1).int().argmax(dim=-1)
    return tokens


def sample(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    row_seeds: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row: ``(tokens (B,), logprobs (B,))``; with ``row_seeds`` and ``positions`` each row's
    uniform is ``counter_uniforms(seed, position)``, else from ``generator``."""
    logprobs_all = sampling_logprobs(logits, temperature=temperature, top_k=top_k, top_p=top_p)  # (B, V)
    if greedy:
        tokens = logprobs_all.argmax(dim=-1)
    elif row_seeds is not None:
        if positions is None:
            raise ValueError("sample: row_seeds needs positions (the counter of each row's draw)")
        tokens = inverse_cdf_sample(logprobs_all.exp(), counter_uniforms(row_seeds, positions))
    else:
        # Drawn where the generator lives (a host generator may drive a GPU sampler), then moved.
        where = logits.device if generator is None else generator.device
        uniforms = torch.rand(logits.shape[0], generator=generator, dtype=torch.float64, device=where)
        uniforms = uniforms.to(logits.device)
        tokens = inverse_cdf_sample(logprobs_all.exp(), uniforms)
    return tokens, logprobs_all.gather(-1, tokens[:, None]).squeeze(-1)

