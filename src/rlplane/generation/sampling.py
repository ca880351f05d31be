"""Logit processing and sampling shared by generation backends.

Order as in transformers and vLLM: temperature, then top-k, then top-p. Filtered tokens get
``-inf`` so that ``log_softmax`` of the result is the distribution the sampler draws from.
"""

from __future__ import annotations

import torch


def apply_top_k(logits: torch.Tensor, top_k: int | None) -> torch.Tensor:
    """Keep the ``top_k`` largest logits per row (ties at the k-th value are kept). (B, V) -> (B, V)."""
    if not top_k or top_k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filter: keep the smallest set of most likely tokens whose mass reaches ``top_p``.

    In descending order a token is dropped when the mass of the tokens before it already reaches
    ``top_p`` (equivalent to transformers' ``TopPLogitsWarper``); the most likely token is always kept.
    (B, V) -> (B, V).
    """
    if top_p >= 1.0:
        return logits
    sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)  # (B, V)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # (B, V) exclusive cumulative mass
    drop_sorted = mass_before >= top_p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter_(-1, sorted_idx, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def process_logits(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float) -> torch.Tensor:
    """``logits / temperature`` then top-k then top-p. (B, V) float -> (B, V) float."""
    if temperature <= 0:
        raise ValueError(f"temperature = {temperature}: must be > 0; use greedy=True for argmax decoding")
    if temperature != 1.0:
        logits = logits / temperature
    return apply_top_p(apply_top_k(logits, top_k), top_p)


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
    logprobs_all = process_logits(logits.float(), temperature, top_k, top_p).log_softmax(dim=-1)  # (B, V)
    if greedy:
        tokens = logprobs_all.argmax(dim=-1)
    else:
        tokens = torch.multinomial(logprobs_all.exp(), 1, generator=generator).squeeze(-1)
    return tokens, logprobs_all.gather(-1, tokens[:, None]).squeeze(-1)
