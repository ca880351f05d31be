"""How a shard's rows are cut into micro-batches: fixed-size, by token budget (``policy.dynamic_batching``)
or packed several sequences to a row (``policy.sequence_packing``).

The loss is normalised by global counts, so any cut gives the same summed loss and gradient. Packed rows
restart ``position_ids`` per sequence with ``attention_mask=None``, so transformers (4.54+) builds the
block-diagonal mask for SDPA/eager and varlen for FlashAttention-2. Rows default to the longest sequence's
width rather than ``max_tokens``: on CPU attention cost grows with the square of the row width.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PackedLayout:
    """Where each sample of a packed micro-batch sits: row ``row[i]``, columns ``offset[i] : offset[i] + len``."""

    row: torch.Tensor  # (b,) packed row of each sample
    offset: torch.Tensor  # (b,) first column of each sample in its row
    num_rows: int
    width: int


@dataclass(frozen=True)
class MicroBatch:
    """``rows`` (b,): the shard's rows in output order; ``packing``: their packed layout (None: right-padded)."""

    rows: torch.Tensor
    packing: PackedLayout | None = None


def fixed_microbatches(rows: torch.Tensor, size: int) -> list[MicroBatch]:
    """Consecutive chunks of ``size`` rows (the last may be shorter)."""
    return [MicroBatch(r) for r in rows.split(size)]


def token_budget_microbatches(rows: torch.Tensor, lengths: torch.Tensor, max_tokens: int) -> list[MicroBatch]:
    """Dynamic batching: rows longest first (stable), cut greedily so ``len(mb) × its longest ≤ max_tokens``."""
    order = rows[torch.argsort(lengths[rows], descending=True, stable=True)].tolist()
    out: list[list[int]] = []
    for r in order:
        # Longest first: the micro-batch's longest is its first row.
        if out and (len(out[-1]) + 1) * int(lengths[out[-1][0]]) <= max_tokens:
            out[-1].append(r)
        else:
            out.append([r])
    return [MicroBatch(torch.tensor(mb, dtype=torch.long, device=rows.device)) for mb in out]


def first_fit_decreasing(rows: torch.Tensor, lengths: torch.Tensor, width: int) -> list[list[int]]:
    """Bins of total length ≤ ``width``: longest first (ties keep their order), each into the first bin it fits."""
    order = rows[torch.argsort(lengths[rows], descending=True, stable=True)].tolist()
    bins: list[list[int]] = []
    free: list[int] = []
    for r in order:
        n = int(lengths[r])
        for b, room in enumerate(free):
            if n <= room:
                bins[b].append(r)
                free[b] -= n
                break
        else:
            bins.append([r])
            free.append(width - n)
    return bins


def packed_microbatches(rows: torch.Tensor, lengths: torch.Tensor, max_tokens: int,
                        row_tokens: int | None = None) -> list[MicroBatch]:
    """Sequence packing: first-fit-decreasing rows of width ``row_tokens`` (None: the longest), then
    ``max(1, max_tokens // width)`` packed rows per micro-batch."""
    if len(rows) == 0:
        return []
    width = max(int(lengths[rows].max()), row_tokens or 0)
    bins = first_fit_decreasing(rows, lengths, width)
    per_mb = max(1, max_tokens // width)
    out = []
    for start in range(0, len(bins), per_mb):
        chunk = bins[start : start + per_mb]
        samples, row, offset = [], [], []
        for r, members in enumerate(chunk):
            at = 0
            for s in members:
                samples.append(s)
                row.append(r)
                offset.append(at)
                at += int(lengths[s])
        layout = PackedLayout(torch.tensor(row, device=rows.device), torch.tensor(offset, device=rows.device),
                              len(chunk), width)
        out.append(MicroBatch(torch.tensor(samples, dtype=torch.long, device=rows.device), layout))
    return out


def microbatch_planner(policy_cfg, train: bool,
                       size: int | None = None) -> Callable[[torch.Tensor, torch.Tensor], list[MicroBatch]]:
    """``plan(rows, lengths)`` for the run's packing or dynamic batching, for training or logprobs (budgets
    default to ``max_total_sequence_length ×`` the micro-batch size); off: fixed chunks. ``size``: a per-call
    micro-batch size in place of the config's (NeMo RL's ``micro_batch_size`` / ``mbs``)."""
    p = policy_cfg
    if size is not None and size < 1:
        raise ValueError(f"micro-batch size {size}: must be >= 1")
    size = size or (p.train_micro_batch_size if train else p.logprob_batch_size)
    for section in (p.sequence_packing, p.dynamic_batching):
        if section.enabled:
            budget = section.train_mb_tokens if train else section.logprob_mb_tokens
            budget = budget if budget is not None else p.max_total_sequence_length * size
            if section is p.sequence_packing:
                return lambda rows, lengths: packed_microbatches(rows, lengths, budget, section.row_tokens)
            return lambda rows, lengths: token_budget_microbatches(rows, lengths, budget)
    return lambda rows, lengths: fixed_microbatches(rows, size)


def pack_inputs(input_ids: torch.Tensor, lengths: torch.Tensor, mb: MicroBatch, pad_id: int = 0):
    """``(input_ids, position_ids, where)``: (R, W) packed inputs and (b, L) flat index ``row·W + column`` of each
    sample's tokens (past its length: column 0, masked). Row tails restart positions, attending to no sample."""
    lay = mb.packing
    n = lengths[mb.rows]  # (b,)
    longest = int(n.max())
    t = torch.arange(longest, device=input_ids.device)
    valid = t[None, :] < n[:, None]  # (b, L)
    where = lay.row[:, None] * lay.width + torch.where(valid, lay.offset[:, None] + t[None, :], 0)  # (b, L)
    flat_ids = torch.full((lay.num_rows * lay.width,), pad_id, dtype=input_ids.dtype, device=input_ids.device)
    flat_ids[where[valid]] = input_ids[mb.rows, :longest][valid]
    # Position of each column from the start of its block (a sample, or a row's tail).
    cols = torch.arange(lay.width, device=input_ids.device)
    used = torch.zeros(lay.num_rows, dtype=torch.long, device=input_ids.device)
    used = used.scatter_reduce(0, lay.row, lay.offset + n, reduce="amax")  # (R,) columns holding samples
    positions = (cols[None, :] - used[:, None]).reshape(-1)  # (R·W,) the tails' count from 0
    positions[where[valid]] = t.expand_as(valid)[valid]
    return flat_ids.view(lay.num_rows, lay.width), positions.view(lay.num_rows, lay.width), where


def unpack_rows(values: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """(R, W, ...) outputs of a packed forward → (b, L, ...) per-sample rows (``where`` from :func:`pack_inputs`)."""
    return values.reshape(-1, *values.shape[2:])[where]


@contextlib.contextmanager
def output_rows(model, keep: torch.Tensor):
    """Within: the lm_head runs on ``hidden[keep]`` only (``keep`` (b, L) bool), so logits are (N, V).
    A pre-hook, since only recent transformers accept a 2-D ``logits_to_keep``."""
    handle = model.get_output_embeddings().register_forward_pre_hook(lambda mod, args: (args[0][keep], *args[1:]))
    try:
        yield
    finally:
        handle.remove()


def forward_microbatch(model, input_ids: torch.Tensor, lengths: torch.Tensor, mb: MicroBatch, trim: bool,
                       logits_at: torch.Tensor | None = None):
    """``(logits, ids)`` (b, L, ...) of ``mb``'s samples as right-padded rows (L: the micro-batch's longest with
    ``trim`` or packing, else the shard's width); ``logits_at`` (b, T) bool gives (N, V) for those positions only."""
    if mb.packing is not None:
        packed_ids, positions, where = pack_inputs(input_ids, lengths, mb)
        out = model(input_ids=packed_ids, position_ids=positions, attention_mask=None, use_cache=False).logits
        return unpack_rows(out, where), input_ids[mb.rows, : where.shape[1]]
    width = int(lengths[mb.rows].max()) if trim else input_ids.shape[1]
    ids = input_ids[mb.rows, :width]  # (b, L)
    attn = (torch.arange(width, device=ids.device)[None, :] < lengths[mb.rows, None]).long()  # (b, L)
    rows = output_rows(model, logits_at[:, :width]) if logits_at is not None else contextlib.nullcontext()
    with rows:
        return model(input_ids=ids, attention_mask=attn, use_cache=False).logits, ids


def pad_columns(x: torch.Tensor, width: int) -> torch.Tensor:
    """(b, L, ...) → (b, width, ...) with zeros after column L (per-token outputs back to the batch's width)."""
    if x.shape[1] == width:
        return x
    return torch.cat([x, x.new_zeros(x.shape[0], width - x.shape[1], *x.shape[2:])], dim=1)
