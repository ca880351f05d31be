"""Codec: jagged <-> padded round trips on random shapes and dtypes, and the numpy wire form."""

import pytest
import torch

from rlplane.dataplane.codec import (
    Column,
    from_wire,
    gather_dense,
    gather_jagged,
    jagged_from_padded,
    pack_rows,
    to_wire,
)

DTYPES = [torch.int64, torch.int32, torch.float32, torch.float16, torch.bfloat16, torch.bool, torch.uint8]


def rand_rows(g, n, dtype, trail=()):
    lens = torch.randint(0, 9, (n,), generator=g).tolist()
    rows = []
    for L in lens:
        x = torch.randn((L, *trail), generator=g) * 10
        rows.append(x > 0 if dtype == torch.bool else x.to(dtype))
    return rows


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("trail", [(), (3,)])
def test_jagged_round_trip_random_order(dtype, trail):
    g = torch.Generator().manual_seed(hash((str(dtype), trail)) % 2**31)
    for _ in range(5):
        n = int(torch.randint(1, 12, (1,), generator=g))
        rows = rand_rows(g, n, dtype, trail)
        col = from_wire(to_wire(pack_rows(rows)))  # through the numpy wire form too
        assert col.values.dtype == dtype and col.num_rows == n
        order = torch.randperm(n, generator=g).tolist()
        T = max(r.shape[0] for r in rows) + 2
        pad = False if dtype == torch.bool else 7
        out = gather_jagged([(col, order, list(range(n)))], n, T, pad)  # (n, T, *trail)
        assert out.shape == (n, T, *trail) and out.dtype == dtype
        for i, r in enumerate(order):
            L = rows[r].shape[0]
            assert torch.equal(out[i, :L], rows[r])
            assert (out[i, L:] == pad).all()
        whole = gather_jagged([(col, list(range(n)), list(range(n)))], n, T, pad)  # the whole chunk in order
        assert whole.dtype == dtype
        for i, r in enumerate(rows):
            assert torch.equal(whole[i, : r.shape[0]], r) and (whole[i, r.shape[0]:] == pad).all()


def test_gather_from_several_chunks_scatters_to_positions():
    a = pack_rows([torch.tensor([1, 2]), torch.tensor([3])])
    b = pack_rows([torch.tensor([4, 5, 6])])
    out = gather_jagged([(a, [1, 0], [2, 0]), (b, [0], [1])], 3, 3, -1)
    assert out.tolist() == [[1, 2, -1], [4, 5, 6], [3, -1, -1]]


def test_dense_gather_and_wire():
    col = from_wire(to_wire(Column(torch.arange(12).reshape(4, 3).to(torch.bfloat16))))
    assert col.values.dtype == torch.bfloat16
    out = gather_dense([(col, [3, 1], [0, 1]), (col, [0], [2])], 3)
    assert out.float().tolist() == [[9, 10, 11], [3, 4, 5], [0, 1, 2]]


def test_jagged_from_padded_trims_to_lengths():
    padded = torch.arange(12).reshape(3, 4)  # (B=3, T=4)
    col = jagged_from_padded(padded, torch.tensor([2, 4, 0]))
    assert col.row_lengths().tolist() == [2, 4, 0]
    assert col.row(0).tolist() == [0, 1] and col.row(1).tolist() == [4, 5, 6, 7] and col.row(2).numel() == 0
    assert jagged_from_padded(padded, torch.tensor([9, 1, 1])).row_lengths().tolist() == [4, 1, 1]


def test_jagged_from_padded_keeps_trailing_dims_and_empty_widths():
    padded = torch.arange(24).reshape(2, 3, 4)  # (B=2, T=3, trail=4)
    col = jagged_from_padded(padded, torch.tensor([1, 3]))
    # row 0: position 0 -> values 0..3; row 1: positions 0..2 of the second row -> values 12..23
    assert col.values.shape == (4, 4) and col.values[0].tolist() == [0, 1, 2, 3]
    assert col.values[1:].flatten().tolist() == list(range(12, 24))
    empty = jagged_from_padded(torch.zeros(2, 0), torch.tensor([0, 0]))
    assert empty.values.shape == (0,) and empty.offsets.tolist() == [0, 0, 0]


def test_a_whole_chunk_in_order_gathers_as_row_by_row():
    col = pack_rows([torch.tensor([1, 2, 3]), torch.tensor([4]), torch.tensor([5, 6])])
    fast = gather_jagged([(col, [0, 1, 2], [0, 1, 2])], 3, 4, -1)  # the one-split path
    slow = gather_jagged([(col, [0, 1], [0, 1]), (col, [2], [2])], 3, 4, -1)  # a slice per row
    assert fast.tolist() == slow.tolist() == [[1, 2, 3, -1], [4, -1, -1, -1], [5, 6, -1, -1]]


def test_column_rows_is_a_self_contained_slice():
    col = pack_rows([torch.tensor([1, 2, 3]), torch.tensor([4]), torch.tensor([5, 6])])
    part = col.rows(1, 3)
    assert part.offsets.tolist() == [0, 1, 3] and part.row(1).tolist() == [5, 6]
    assert Column(torch.arange(6).reshape(3, 2)).rows(2, 3).values.tolist() == [[4, 5]]


def test_read_only_wire_views_are_never_returned():
    col = pack_rows([torch.tensor([1.0, 2.0])])
    values, offsets, dtype = to_wire(col)
    values.setflags(write=False)
    out = gather_jagged([(from_wire((values, offsets, dtype)), [0], [0])], 1, 2, 0)
    out += 1  # a fresh tensor: writable, and the stored data is untouched
    assert values.tolist() == [1.0, 2.0]
