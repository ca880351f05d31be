"""The training forward with each distinct prompt computed once (``policy.shared_prefix_forward``).

Runs each distinct prompt once keeping its keys/values (with gradient), indexes them into every row of
that prompt (the backward sums into the shared prompt), then runs the responses with continued
``position_ids``. Logprobs and gradients equal the plain forward's up to rounding; no-grad forwards take the
same path. Single-turn samples, fixed or token-budget plans only; not with packing, activation
checkpointing or FSDP.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlplane.generation.kv_cache import cache_kwarg
from rlplane.generation.sampling import sampling_logprobs
from rlplane.models.precision import autocast


def applies(policy_cfg) -> bool:
    """Whether the run's settings allow the shared-prefix forward (the batch: :func:`prompt_lengths`)."""
    p = policy_cfg
    return (p.shared_prefix_forward and not p.sequence_packing.enabled and not p.activation_checkpointing
            and not p.dtensor_cfg.enabled)


def prompt_lengths(token_mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor | None:
    """(B,) position of each row's first generated token when every row is a prompt followed by generated
    tokens only (``token_mask`` (B, T)); None otherwise (multi-turn)."""
    tm = token_mask.bool()
    pos = torch.arange(tm.shape[1], device=tm.device)
    first = torch.where(tm.any(1), tm.int().argmax(1), lengths)  # (B,)
    generated = (pos[None, :] >= first[:, None]) & (pos[None, :] < lengths[:, None])  # (B, T)
    if not torch.equal(tm, generated) or bool((first < 1).any()):
        return None
    return first


def shared_prefix_logprobs(model, input_ids: torch.Tensor, lengths: torch.Tensor, prompt_lens: torch.Tensor,
                           rows: torch.Tensor, temperature: float, top_k: int | None = None, top_p: float = 1.0,
                           unfiltered: bool = False, pad_id: int = 0):
    """Per-token logprobs of ``input_ids[rows]`` (b, T) as :func:`token_logprobs` gives them; with ``unfiltered``
    ``(filtered, unfiltered)``. ``prompt_lens`` (B,) from :func:`prompt_lengths`."""
    ids, n, p = input_ids[rows], lengths[rows], prompt_lens[rows]  # (b, T), (b,), (b,)
    b, width = ids.shape
    device = ids.device
    unique: dict[tuple[int, ...], int] = {}  # prompt -> its index u
    to_unique, first = [], []  # per row its u; per u the first row holding it
    for i, (r, k) in enumerate(zip(ids.tolist(), p.tolist())):
        u = unique.setdefault(tuple(r[:k]), len(unique))
        if u == len(first):
            first.append(i)
        to_unique.append(u)
    row_to_unique = torch.tensor(to_unique, device=device)  # (b,)
    first_row = torch.tensor(first, device=device)  # (U,)
    pu = p[first_row]  # (U,)
    P = int(pu.max())
    cols = torch.arange(P, device=device)
    prefix_mask = (cols[None, :] < pu[:, None]).long()  # (U, P)
    prefix_ids = ids[first_row, :P].masked_fill(prefix_mask == 0, pad_id)
    R = int((n - p).max())  # the longest response (0: no row generated anything)
    j = torch.arange(R, device=device)
    where = p[:, None] + j[None, :]  # (b, R) each response token's column
    valid = j[None, :] < (n - p)[:, None]  # (b, R)
    resp_ids = F.pad(ids, (0, R)).gather(1, where).masked_fill(~valid, pad_id)  # (b, R)
    with autocast(model):
        out = model(input_ids=prefix_ids, attention_mask=prefix_mask,
                    position_ids=cols[None, :].expand(len(pu), P), use_cache=True)
        prompt_logits = out.logits  # (U, P, V): column c predicts the prompt's token c + 1, its last one token p
        # index_select: its backward (index_add) is faster on CPU than indexing's index_put.
        last = torch.arange(len(pu), device=device) * P + pu - 1  # (U,) each prompt's last token, flattened
        first_logits = prompt_logits.flatten(0, 1).index_select(0, last)  # (U, V)
        logits = first_logits.index_select(0, row_to_unique)[:, None, :][:, :R]  # (b, min(R, 1), V)
        if R > 1:
            cache = out.past_key_values
            for layer in cache.layers:  # (U, ...) -> (b, ...); the backward sums the copies' gradients
                layer.keys = layer.keys.index_select(0, row_to_unique)
                layer.values = layer.values.index_select(0, row_to_unique)
            mask = torch.cat([prefix_mask[row_to_unique], valid[:, : R - 1].long()], dim=1)  # (b, P + R - 1)
            rest = model(input_ids=resp_ids[:, : R - 1], attention_mask=mask, position_ids=where[:, : R - 1],
                         **{cache_kwarg(model): cache}, use_cache=True).logits  # (b, R - 1, V) predict p+1 ..
            logits = torch.cat([logits, rest], dim=1)  # (b, R, V)
    logits, prompt_logits = logits.float(), prompt_logits[:, :-1].float()  # (b, R, V), (U, P - 1, V)
    in_prompt = cols[None, 1:] < pu[:, None]  # (U, P - 1) prompt tokens 1 .. p - 1

    def logprobs(top_k, top_p) -> torch.Tensor:
        """(b, T): prompt tokens' logprobs (from the prompt's row) and response tokens', 0 elsewhere."""
        pre = sampling_logprobs(prompt_logits, temperature=temperature, top_k=top_k, top_p=top_p,
                                tokens=prefix_ids[:, 1:]).masked_fill(~in_prompt, 0.0)  # (U, P - 1)
        pre = F.pad(pre.index_select(0, row_to_unique), (1, width - P))  # (b, T) columns 1 .. p - 1
        resp = sampling_logprobs(logits, temperature=temperature, top_k=top_k, top_p=top_p, tokens=resp_ids)
        full = torch.zeros((b, width + R), dtype=pre.dtype, device=device)
        # Disjoint columns (prompt < p <= response): the sum places each value as it is.
        return pre + full.scatter(1, where, resp.masked_fill(~valid, 0.0))[:, :width]

    lp = logprobs(top_k, top_p)
    return (lp, logprobs(None, 1.0)) if unfiltered else lp
