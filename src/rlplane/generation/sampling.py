"""Logit processing and sampling, shared by the generation backends and the trainer's logprobs.

Order as in transformers and vLLM: temperature, then top-k, then top-p. Filtered tokens get
``-inf`` so that ``log_softmax`` of the result is the distribution the sampler draws from.

:func:`sampling_logprobs` is the one place that distribution is computed: the ``hf`` sampler draws
from it and the policy worker computes ``prev_logprobs`` and the loss's current logprobs with it, so
``generation_logprobs`` and the training logprobs are the same function of the logits (their ratio
is 1 when the weights are the same) and cannot drift apart.
"""

from __future__ import annotations

import torch

# Rows of the flattened (N, V) logits whose top-p mask is computed at once: the sort makes (rows, V)
# values and int64 indices, which for a 150k vocabulary and a few thousand tokens would not fit.
_MASK_CHUNK_ROWS = 256


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
    """True where a token lies outside the nucleus of its row (``logits`` may already hold -inf).

    In descending order a token is dropped when the mass of the tokens before it already reaches
    ``top_p``; the most likely token is always kept. This is transformers' ``TopPLogitsWarper`` and
    vLLM's ``apply_top_k_top_p`` (ascending order, keep where cumsum > 1 - top_p: the same set, as
    the ascending cumsum at a token is 1 minus the mass before it in descending order).
    """
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
    """Nucleus filter: keep the smallest set of most likely tokens whose mass reaches ``top_p``.

    See :func:`_top_p_drop` for the rule. (..., V) -> (..., V).
    """
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
    """``logits / temperature`` then top-k then top-p. (..., V) float -> (..., V) float.

    ``keep`` (...,) long, optional: one token id per row that stays in the kept set whatever the
    filters say (the trainer passes the token that was generated there; see :func:`sampling_logprobs`).

    Gradient: the masks are computed without gradient and applied with ``masked_fill``, so a kept
    logit gets the gradient of the renormalised ``log_softmax`` and a filtered one gets 0.
    """
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
    """Log-probabilities under the sampling distribution: ``log_softmax(process_logits(logits))``.

    Without ``tokens``: the whole distribution, (..., V) float32, ``-inf`` on filtered tokens (what
    the ``hf`` sampler draws from). With ``tokens`` (...,) long: the logprob of each token, (...,)
    float32, computed with that token kept in the set, so it is always finite. When the token is in
    the kept set (always, for a token sampled from this distribution) this is the same number; a
    token that only a rounding difference between the sampler's and the trainer's forward pushed
    just outside the set (a top-p boundary) gets its logprob renormalised over kept + itself instead
    of ``-inf``, which would make the PPO ratio ``exp(curr - prev)`` infinite or NaN.
    """
    processed = process_logits(logits.float(), temperature, top_k, top_p, keep=tokens)
    logprobs = processed.log_softmax(dim=-1)  # (..., V)
    if tokens is None:
        return logprobs
    return logprobs.gather(-1, tokens[..., None]).squeeze(-1)


def sample(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row; returns ``(tokens (B,), logprobs (B,))`` under the processed distribution."""
    logprobs_all = sampling_logprobs(logits, temperature=temperature, top_k=top_k, top_p=top_p)  # (B, V)
    if greedy:
        tokens = logprobs_all.argmax(dim=-1)
    else:
        tokens = torch.multinomial(logprobs_all.exp(), 1, generator=generator).squeeze(-1)
    return tokens, logprobs_all.gather(-1, tokens[:, None]).squeeze(-1)
