"""version_carry: each sample's oldest token version and its tokens per version, on hand-made rows."""

from __future__ import annotations

import torch

from rlplane.async_rl.staleness import version_carry


def test_oldest_version_and_tokens_per_version():
    versions = [torch.tensor([-1, -1, 3, 3, 4]),  # prompt of 2, then 3 generated tokens
                torch.tensor([-1, 5, 7, 9]),
                torch.tensor([-1, -1]),  # nothing generated
                torch.tensor([-1, 6, 6])]
    mask = [torch.tensor([0, 0, 1, 1, 1], dtype=torch.int8), torch.tensor([0, 1, 1, 1], dtype=torch.int8),
            torch.tensor([0, 0], dtype=torch.int8), torch.tensor([0, 1, 0], dtype=torch.int8)]
    out = version_carry(versions, mask, default=8, span=1)
    # Row 0: oldest 3; ages 3-3=0, 0, 4-3=1 -> [2, 1]. Row 1: oldest 5; ages 0, 2, 4, capped at span 1
    # -> [1, 2]. Row 2: no generated token: oldest is the default 8, [0, 0]. Row 3: only its middle
    # token is on the mask (the last one's version 6 does not count either way): oldest 6, [1, 0].
    assert out["oldest_version"].tolist() == [3, 5, 8, 6]
    assert out["version_tokens/0"].tolist() == [2, 1, 0, 1]
    assert out["version_tokens/1"].tolist() == [1, 2, 0, 0]
    assert out["oldest_version"].dtype == out["version_tokens/0"].dtype == torch.long


def test_span_zero_counts_every_token_in_one_column():
    out = version_carry([torch.tensor([2, 3, 4])], [torch.tensor([1, 1, 1], dtype=torch.int8)], default=0, span=0)
    # Oldest 2, every age capped at 0: all 3 tokens in version_tokens/0.
    assert out["oldest_version"].tolist() == [2] and out["version_tokens/0"].tolist() == [3]
