"""Column codec: how one field of one put is stored ("chunk"), and how rows come back padded.

Jagged: `values` (Σ L_i, *trail) with `offsets` (n + 1,), row i = `values[offsets[i]:offsets[i + 1]]`
(per-token fields, no padding stored). Dense: `values` (n, *shape). Reads gather into fresh tensors, since a
chunk may be a read-only view of Ray's shared memory. On the wire chunks are numpy arrays (zero-copy from
Ray); dtypes numpy lacks ride as same-width integers.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["Column", "from_wire", "gather_dense", "gather_jagged", "jagged_from_padded", "pack_rows", "to_wire"]


@dataclasses.dataclass
class Column:
    """One field's rows from one put. `offsets` is None for a dense column."""

    values: torch.Tensor  # jagged: (sum L, *trail); dense: (n, *shape)
    offsets: torch.Tensor | None = None  # jagged only: (n + 1,) int64

    @property
    def jagged(self) -> bool:
        return self.offsets is not None

    @property
    def num_rows(self) -> int:
        return len(self.offsets) - 1 if self.offsets is not None else len(self.values)

    def row_lengths(self) -> torch.Tensor:
        """(n,) int64 length of every row (jagged only)."""
        assert self.offsets is not None
        return self.offsets[1:] - self.offsets[:-1]

    def row(self, i: int) -> torch.Tensor:
        if self.offsets is None:
            return self.values[i]
        return self.values[int(self.offsets[i]) : int(self.offsets[i + 1])]

    def rows(self, start: int, stop: int) -> Column:
        """Rows start..stop-1 as a column of their own (views, no copy)."""
        if self.offsets is None:
            return Column(self.values[start:stop])
        lo, hi = int(self.offsets[start]), int(self.offsets[stop])
        return Column(self.values[lo:hi], self.offsets[start : stop + 1] - lo)

    @property
    def nbytes(self) -> int:
        n = self.values.numel() * self.values.element_size()
        return n + (0 if self.offsets is None else self.offsets.numel() * 8)


def pack_rows(rows: Sequence[torch.Tensor]) -> Column:
    """Jagged column from a list of tensors that share trailing dims: (L_i, *trail) each."""
    if not rows:
        return Column(torch.zeros(0), torch.zeros(1, dtype=torch.int64))
    if rows[0].dim() == 0:  # rows agree in rank (checked by the caller): scalars become length 1
        rows = [r.reshape(1) for r in rows]
    # shape[0], not len(), and via numpy: cheaper
    lens = torch.from_numpy(np.array([r.shape[0] for r in rows], dtype=np.int64))
    offsets = torch.zeros(len(rows) + 1, dtype=torch.int64)
    torch.cumsum(lens, 0, out=offsets[1:])
    return Column(torch.cat(rows).detach().cpu().contiguous(), offsets)


def jagged_from_padded(padded: torch.Tensor, lengths: torch.Tensor) -> Column:
    """Jagged column of `padded[i, :lengths[i]]` from (B, T, *trail); lengths > T keep all T."""
    lens = lengths.to(torch.int64).clamp(max=padded.shape[1])
    offsets = torch.zeros(len(lens) + 1, dtype=torch.int64)
    torch.cumsum(lens, 0, out=offsets[1:])
    if not len(lens) or padded.shape[1] == 0:
        return Column(padded.reshape(len(lens) * padded.shape[1], *padded.shape[2:])[:0].contiguous(), offsets)
    # One C++ split into (row, padding) pieces, then a cat: cheaper than a loop of slices or a boolean mask.
    T = padded.shape[1]
    flat = padded.reshape(len(lens) * T, *padded.shape[2:])
    sizes = torch.stack([lens, T - lens], dim=1).reshape(-1).tolist()
    return Column(torch.cat(torch.split(flat, sizes)[::2]), offsets)


def gather_jagged(
    parts: Sequence[tuple[Column, Sequence[int], Sequence[int]]],
    batch: int,
    pad_len: int,
    pad_value: float | int | bool,
) -> torch.Tensor:
    """Padded (batch, pad_len, *trail) tensor from jagged chunks.

    parts: (column, rows in it, output positions); every position in [0, batch) once. Rows must fit pad_len.
    """
    ref = parts[0][0].values
    if batch == 0:
        out = torch.full((batch, pad_len, *ref.shape[1:]), pad_value, dtype=ref.dtype)
        for col, rows, pos in parts:
            assert col.offsets is not None
            offsets = col.offsets.tolist()
            for r, p in zip(rows, pos):
                out[p, : offsets[r + 1] - offsets[r]] = col.values[offsets[r] : offsets[r + 1]]
        return out
    if len(parts) == 1 and _in_order(parts[0], batch):
        # The whole chunk in order (a DP rank reading its own shard): its values as they are.
        col = parts[0][0]
        assert col.offsets is not None
        return _pad_rows(col.values, col.row_lengths(), batch, pad_len, pad_value)
    views: list = [None] * batch  # row views in output order
    for col, rows, pos in parts:
        assert col.offsets is not None
        if 4 * len(rows) >= col.num_rows:
            # A good share of the chunk: views from one C++ split, then picked.
            row_views = torch.split(col.values, col.row_lengths().tolist())
            for r, p in zip(rows, pos):
                views[p] = row_views[r]
            continue
        offsets = col.offsets.tolist()
        values = col.values
        for r, p in zip(rows, pos):
            views[p] = values[offsets[r] : offsets[r + 1]]
    lengths = torch.from_numpy(np.array([v.shape[0] for v in views], dtype=np.int64))
    return _pad_rows(torch.cat(views), lengths, batch, pad_len, pad_value)


def _pad_rows(values: torch.Tensor, lengths: torch.Tensor, batch: int, pad_len: int,
              pad_value: float | int | bool) -> torch.Tensor:
    """(batch, pad_len, *trail) from rows laid end to end in ``values`` (N, *trail) with ``lengths`` (batch,):
    one masked write in row-major order (a per-row copy costs three small ops a row)."""
    out = torch.full((batch, pad_len, *values.shape[1:]), pad_value, dtype=values.dtype, device=values.device)
    out[torch.arange(pad_len, device=values.device)[None, :] < lengths.to(values.device)[:, None]] = values
    return out


def _in_order(part: tuple[Column, Sequence[int], Sequence[int]], batch: int) -> bool:
    """True if `part` maps every row of its column, in order, to output positions 0..batch-1."""
    col, rows, pos = part
    if col.num_rows != batch or len(rows) != batch:
        return False
    expect = np.arange(batch)
    return bool(np.array_equal(np.asarray(rows), expect) and np.array_equal(np.asarray(pos), expect))


def gather_dense(parts: Sequence[tuple[Column, Sequence[int], Sequence[int]]], batch: int) -> torch.Tensor:
    """(batch, *shape) tensor from dense chunks; `parts` as in `gather_jagged`."""
    ref = parts[0][0].values
    out = torch.empty((batch, *ref.shape[1:]), dtype=ref.dtype)
    for col, rows, pos in parts:
        out[torch.as_tensor(pos, dtype=torch.int64)] = col.values[torch.as_tensor(rows, dtype=torch.int64)]
    return out


# ---- wire form (numpy, zero-copy reads out of Ray's object store)

# Dtypes numpy has no equivalent for travel as same-width integers.
_VIEW_AS = {torch.bfloat16: torch.int16}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        _VIEW_AS[getattr(torch, _name)] = torch.uint8
_BY_NAME = {str(d): d for d in [*_VIEW_AS, torch.float32]}


def to_wire(col: Column) -> tuple[np.ndarray, np.ndarray | None, str]:
    """(values as numpy, offsets as numpy or None, torch dtype name)."""
    v = col.values.detach().cpu().contiguous()
    dtype = str(v.dtype)
    if v.dtype in _VIEW_AS:
        v = v.view(_VIEW_AS[v.dtype])
    offsets = None if col.offsets is None else col.offsets.numpy()
    return v.numpy(), offsets, dtype


def from_wire(wire: tuple[np.ndarray, np.ndarray | None, str]) -> Column:
    """Column over the wire arrays without copying (views may be read-only: never write to them)."""
    values, offsets, dtype = wire
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "The given NumPy array is not writable"
        v = torch.from_numpy(values)
        o = None if offsets is None else torch.from_numpy(offsets)
    if dtype in _BY_NAME and _BY_NAME[dtype] in _VIEW_AS:
        v = v.view(_BY_NAME[dtype])
    return Column(v, o)
