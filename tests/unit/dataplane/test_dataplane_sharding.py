"""shard_meta_for_dp: balance, equal shares of every global batch, inverse permutation, pad length."""

import random

import pytest
import torch

from rlplane.dataplane import GLOBAL_PAD_KEY, DataPlaneError, KVBatchMeta, balance_rows, shard_meta_for_dp


def meta_of(lens, **info):
    ids = tuple(f"s{i}" for i in range(len(lens)))
    return KVBatchMeta("train", None, ids, ("input_ids",), tuple(lens), extra_info=info)


def test_balance_rows_hand_example():
    # lengths 9 8 7 6 5 4 into 2 bins of 3: LPT gives 9->A, 8->B, 7->B(8<9), 6->A(9<15), 5->A?  A=15,
    # B=15 -> tie goes to the lower bin A (full after 3), 4->B. A = {9, 6, 5} = 20, B = {8, 7, 4} = 19.
    bins = balance_rows([9, 8, 7, 6, 5, 4], 2, [3, 3])
    assert bins == [[0, 3, 4], [1, 2, 5]]


def test_balance_beats_contiguous_on_sorted_lengths():
    lens = list(range(1000, 0, -1))  # worst case for contiguous slices
    metas, _ = shard_meta_for_dp(meta_of(lens), 4)
    loads = [sum(m.seq_lens) for m in metas]
    assert max(loads) - min(loads) <= max(lens)
    naive, _ = shard_meta_for_dp(meta_of(lens), 4, balance=False)
    naive_loads = [sum(m.seq_lens) for m in naive]
    assert max(loads) - min(loads) < (max(naive_loads) - min(naive_loads)) / 100


@pytest.mark.parametrize("n,world,gbs", [(16, 2, None), (17, 4, None), (24, 2, 8), (24, 4, 12), (3, 4, None)])
def test_inverse_permutation_restores_order(n, world, gbs):
    rng = random.Random(n * world)
    meta = meta_of([rng.randint(1, 100) for _ in range(n)])
    metas, inverse = shard_meta_for_dp(meta, world, gbs)
    assert sorted(s for m in metas for s in m.sample_ids) == sorted(meta.sample_ids)
    # A per-row output computed on each rank, gathered rank by rank, then put back in order.
    outputs = torch.cat([torch.tensor([int(s[1:]) for s in m.sample_ids], dtype=torch.int64) for m in metas])
    assert outputs[inverse].tolist() == list(range(n))
    sizes = [len(m) for m in metas]
    assert max(sizes) - min(sizes) <= 1


def test_every_rank_gets_its_share_of_every_global_batch():
    rng = random.Random(0)
    lens = [rng.randint(1, 500) for _ in range(32)]
    metas, _ = shard_meta_for_dp(meta_of(lens), 2, batch_size=8)  # 4 global batches, 4 rows per rank each
    for r, m in enumerate(metas):
        assert len(m) == 16 and m.extra_info["rows_per_global_batch"] == 4 and m.extra_info["dp_rank"] == r
        idx = [int(s[1:]) for s in m.sample_ids]
        for g in range(4):  # rows 4g..4g+3 of this rank come from global batch g, in original order
            chunk = idx[4 * g : 4 * g + 4]
            assert all(8 * g <= i < 8 * (g + 1) for i in chunk) and chunk == sorted(chunk)


def test_global_pad_len_is_common_and_rounded():
    metas, _ = shard_meta_for_dp(meta_of([1208, 1320, 944, 1080], pad_to_multiple=64), 2)
    assert {m.extra_info[GLOBAL_PAD_KEY] for m in metas} == {1344}  # NeMo RL README's example
    metas, _ = shard_meta_for_dp(meta_of([5, 3]), 2, pad_to_multiple=4)
    assert metas[1].extra_info[GLOBAL_PAD_KEY] == 8


def test_sharding_errors():
    with pytest.raises(DataPlaneError, match="batch_size = 5"):
        shard_meta_for_dp(meta_of([1] * 10), 2, batch_size=5)
    with pytest.raises(DataPlaneError, match="needs the meta's seq_lens"):
        shard_meta_for_dp(KVBatchMeta("train", None, ("a",)), 1)
    with pytest.raises(DataPlaneError, match="dp_world = 0"):
        shard_meta_for_dp(meta_of([1]), 0)
