"""Data-parallel sharding of a meta from metadata alone.

As NeMo RL's `shard_by_batch_size`: each global batch of `batch_size` rows is split evenly across ranks,
balancing tokens per rank (greedy LPT, equal row counts). All ranks get one `global_forward_pad_seqlen`.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Sequence

import torch

from .errors import DataPlaneError
from .meta import GLOBAL_PAD_KEY, PAD_MULTIPLE_KEY, KVBatchMeta

__all__ = ["balance_rows", "dp_shard_rows", "global_pad_len", "shard_meta_for_dp"]


def global_pad_len(seq_lens: Sequence[int], pad_to_multiple: int = 1) -> int:
    """max(seq_lens) rounded up to a multiple of `pad_to_multiple` (0 for an empty batch)."""
    longest = max(seq_lens, default=0)
    m = max(int(pad_to_multiple), 1)
    return -(-longest // m) * m


def balance_rows(lengths: Sequence[int], num_bins: int, bin_sizes: Sequence[int] | None = None) -> list[list[int]]:
    """Indices of `lengths` in `num_bins` bins of `bin_sizes` rows with balanced sums (greedy LPT), each ascending."""
    n = len(lengths)
    if bin_sizes is None:
        bin_sizes = [n // num_bins + (1 if b < n % num_bins else 0) for b in range(num_bins)]
    assert sum(bin_sizes) == n, (bin_sizes, n)
    order = sorted(range(n), key=lambda i: (-lengths[i], i))
    heap = [(0, b) for b in range(num_bins) if bin_sizes[b] > 0]
    heapq.heapify(heap)
    bins: list[list[int]] = [[] for _ in range(num_bins)]
    for i in order:
        load, b = heapq.heappop(heap)
        bins[b].append(i)
        if len(bins[b]) < bin_sizes[b]:
            heapq.heappush(heap, (load + lengths[i], b))
    return [sorted(b) for b in bins]


def shard_meta_for_dp(
    meta: KVBatchMeta,
    dp_world: int,
    batch_size: int | None = None,
    *,
    pad_to_multiple: int | None = None,
    balance: bool = True,
) -> tuple[list[KVBatchMeta], torch.Tensor]:
    """Split `meta` (with `seq_lens`) into one meta per DP rank; returns (per_rank_metas, inverse_permutation).

    `batch_size`: rows per optimizer step, each rank gets batch_size / dp_world of every global batch (None:
    one batch, ranks differ by at most a row). `pad_to_multiple` defaults to the meta's extra_info, else 1;
    `balance=False` keeps contiguous slices. `torch.cat(per_rank_outputs)[inverse]` restores the row order.
    """
    if meta.seq_lens is None:
        raise DataPlaneError(
            f"partition {meta.partition_id!r}: shard_meta_for_dp needs the meta's seq_lens (write a "
            "per-token field such as input_ids first, or pass seq_lens= to put_samples)"
        )
    n = len(meta)
    per_rank, sizes, num_gb = _split(meta.seq_lens, dp_world, batch_size, balance, f"partition {meta.partition_id!r}")

    multiple = pad_to_multiple if pad_to_multiple is not None else meta.extra_info.get(PAD_MULTIPLE_KEY, 1)
    info = {
        GLOBAL_PAD_KEY: global_pad_len(meta.seq_lens, multiple),
        "dp_world": dp_world,
        "num_global_batches": num_gb,
    }
    metas = [
        meta.subset(rows).with_extra_info(**info, dp_rank=r, rows_per_global_batch=sizes[r])
        for r, rows in enumerate(per_rank)
    ]
    perm = torch.tensor([i for rows in per_rank for i in rows], dtype=torch.int64)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(n)
    return metas, inverse


def dp_shard_rows(
    seq_lens: Sequence[int], dp_world: int, batch_size: int | None = None, *, balance: bool = True
) -> list[list[int]]:
    """The row indices of each DP rank as `shard_meta_for_dp` splits them (for `put_samples(shards=...)`)."""
    return _split(seq_lens, dp_world, batch_size, balance, "dp_shard_rows")[0]


def _split(
    seq_lens: Sequence[int], dp_world: int, batch_size: int | None, balance: bool, where: str
) -> tuple[list[list[int]], list[int], int]:
    """(rows of each rank, rows per rank per global batch, number of global batches)."""
    try:
        per_rank, sizes, num_gb = _split_once(tuple(int(x) for x in seq_lens), dp_world, batch_size, balance)
    except DataPlaneError as err:
        raise DataPlaneError(f"{where}: {err}") from None
    return [list(rows) for rows in per_rank], list(sizes), num_gb


@functools.lru_cache(maxsize=16)
def _split_once(
    seq_lens: tuple[int, ...], dp_world: int, batch_size: int | None, balance: bool
) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...], int]:
    # Cached: `dp_shard_rows` and the `shard_meta_for_dp` after it ask for the same split.
    n = len(seq_lens)
    if dp_world < 1:
        raise DataPlaneError(f"dp_world = {dp_world}; it must be >= 1")
    if batch_size is None:
        gbs = n
        sizes = [n // dp_world + (1 if r < n % dp_world else 0) for r in range(dp_world)]
    else:
        if batch_size <= 0 or n % batch_size or batch_size % dp_world:
            raise DataPlaneError(
                f"{n} rows, batch_size = {batch_size}, dp_world = "
                f"{dp_world}: the rows must split into whole global batches and each global batch "
                "evenly across ranks (n % batch_size == 0 and batch_size % dp_world == 0)"
            )
        gbs = batch_size
        sizes = [batch_size // dp_world] * dp_world
    num_gb = n // gbs if gbs else 0

    per_rank: list[list[int]] = [[] for _ in range(dp_world)]
    for g in range(num_gb):
        base = g * gbs
        lens = seq_lens[base : base + gbs]
        if balance:
            bins = balance_rows(lens, dp_world, sizes)
        else:
            starts = [sum(sizes[:r]) for r in range(dp_world)]
            bins = [list(range(starts[r], starts[r] + sizes[r])) for r in range(dp_world)]
        for r in range(dp_world):
            per_rank[r].extend(base + i for i in bins[r])
    return tuple(tuple(rows) for rows in per_rank), tuple(sizes), num_gb
