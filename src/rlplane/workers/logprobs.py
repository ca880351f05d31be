"""Per-token logprobs under a model's sampling distribution, for a batch or one micro-batch of a shard.

``logprobs[:, t] = log π(token_t | tokens_<t)`` under ``policy.generation`` (temperature, top-k, top-p,
renormalised: :func:`rlplane.generation.sampling.sampling_logprobs`), ``logprobs[:, 0] = 0``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlplane.generation.sampling import sampling_logprobs
from rlplane.models.precision import autocast
from rlplane.workers import shared_prefix
from rlplane.workers.packing import MicroBatch, forward_microbatch, pad_columns


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float,
    top_k: int | None = None,
    top_p: float = 1.0,
    unfiltered: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """(B, T) logprobs of ``input_ids`` under ``model``'s sampling distribution; with ``unfiltered`` also the
    temperature-only ones, ``(filtered, unfiltered)``."""
    with autocast(model):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits  # (B, T, V)
    return logprobs_from_logits(logits, input_ids, temperature, top_k, top_p, unfiltered)


def logprobs_from_logits(logits, input_ids, temperature, top_k=None, top_p=1.0, unfiltered=False):
    """:func:`token_logprobs` after the forward: ``logits`` (B, T, V) of ``input_ids`` (B, T)."""
    logits = logits[:, :-1].float()
    targets = input_ids[:, 1:]  # (B, T-1)
    logp = sampling_logprobs(logits, temperature=temperature, top_k=top_k, top_p=top_p, tokens=targets)  # (B, T-1)
    if not unfiltered:
        return F.pad(logp, (1, 0))
    plain = sampling_logprobs(logits, temperature=temperature, top_k=None, top_p=1.0, tokens=targets)
    return F.pad(logp, (1, 0)), F.pad(plain, (1, 0))


def microbatch_logprobs(model, input_ids, lengths, mb: MicroBatch, trim: bool, temperature, top_k=None, top_p=1.0,
                        unfiltered=False, only: torch.Tensor | None = None, prompt_lens: torch.Tensor | None = None,
                        pad_id: int = 0):
    """:func:`token_logprobs` of micro-batch ``mb`` as (b, T) rows in ``mb.rows`` order.

    ``only`` (b, T) bool: compute just those tokens' logprobs (the vocabulary projection is costly), 0
    elsewhere (ignored with packing). ``prompt_lens`` (B,): run each distinct prompt once (shared prefix).
    """
    packed = mb.packing is not None
    if prompt_lens is not None and not packed:
        return shared_prefix.shared_prefix_logprobs(model, input_ids, lengths, prompt_lens, mb.rows, temperature,
                                                    top_k, top_p, unfiltered, pad_id)
    # Logits at column t predict token t + 1.
    at = F.pad(only[:, 1:].bool(), (0, 1)) if only is not None and not packed else None  # (b, T)
    with autocast(model):
        logits, ids = forward_microbatch(model, input_ids, lengths, mb, trim, at)  # (b, L, V) or (N, V); (b, L)
    width = input_ids.shape[1]
    if at is None:
        lp = logprobs_from_logits(logits, ids, temperature, top_k, top_p, unfiltered)
        return tuple(pad_columns(x, width) for x in lp) if unfiltered else pad_columns(lp, width)
    at = at[:, : ids.shape[1] - 1]  # (b, L-1): the logits columns kept, in the order of logits' rows
    targets = ids[:, 1:][at]  # (N,)
    lp = (sampling_logprobs(logits.float(), temperature=temperature, top_k=top_k, top_p=top_p, tokens=targets),)
    if unfiltered:
        lp += (sampling_logprobs(logits.float(), temperature=temperature, top_k=None, top_p=1.0, tokens=targets),)
    # Back to (b, T) rows, 0 at every token not computed.
    lp = tuple(pad_columns(F.pad(torch.zeros(at.shape, device=x.device).masked_scatter(at, x), (1, 0)), width)
               for x in lp)
    return lp if unfiltered else lp[0]
