"""Reward controls: the rewards of a step replaced by ones that carry no information about which response earned
them, so a run with a control measures what the recipe gains from everything but the reward (the warm-up's
momentum, a length drift, the KL term, luck). A recipe whose gain its control matches has learned nothing from
the reward (the random-reward baseline of "Spurious Rewards", arXiv 2506.10947). B samples.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import torch
from torch import Tensor

CONTROLS = ("permute", "coin")


def control_generator(seed: int, sample_ids: Sequence[str]) -> torch.Generator:
    """A CPU generator seeded by the run's ``seed`` and the batch's sample keys: the same batch gets the same
    control draw in every run, whatever else drew random numbers before it (sync or async, any worker count)."""
    digest = zlib.crc32("\n".join(map(str, sample_ids)).encode())
    return torch.Generator().manual_seed((int(seed) * 1_000_003 + digest) % (2**63))


def permute_rewards(columns: dict[str, Tensor], generator: torch.Generator) -> dict[str, Tensor]:
    """Each (B,) column reordered by one random permutation shared by all columns: the batch keeps its rewards (the
    same multiset, mean and spread, and each sample's components still add up) but which sample has which is
    drawn at random."""
    sizes = {len(v) for v in columns.values()}
    if len(sizes) > 1:
        raise ValueError(f"reward columns of different lengths {sorted(sizes)}: permute needs (B,) columns")
    b = sizes.pop() if sizes else 0
    perm = torch.randperm(b, generator=generator)  # (B,)
    return {k: v[perm.to(v.device)] for k, v in columns.items()}


def coin_rewards(rewards: Tensor, generator: torch.Generator) -> Tensor:
    """(B,) rewards drawn independently of the responses: each the batch's highest reward with probability
    p = (mean - lo) / (hi - lo), else its lowest, so the expected mean is the batch's mean (0/1 rewards: a
    Bernoulli(mean) coin per sample). A batch whose rewards are all equal is returned as is (p undefined, no
    information either way)."""
    if rewards.numel() == 0:
        return rewards.clone()
    r = rewards.to(torch.float64)
    lo, hi = r.min(), r.max()
    if hi == lo:
        return rewards.clone()
    p = float((r.mean() - lo) / (hi - lo))
    heads = torch.rand(rewards.shape[0], generator=generator, dtype=torch.float64) < p  # (B,)
    return torch.where(heads.to(rewards.device), hi, lo).to(rewards.dtype)


def control_rewards(kind: str, columns: dict[str, Tensor], generator: torch.Generator) -> dict[str, Tensor]:
    """The reward columns (``rewards`` and any per-component ``reward/<name>``, each (B,)) under control ``kind``:
    ``permute`` (:func:`permute_rewards`, one permutation for all) or ``coin`` (:func:`coin_rewards`, each column
    its own draws from the one generator, in the columns' order)."""
    if kind == "permute":
        return permute_rewards(columns, generator)
    if kind == "coin":
        return {k: coin_rewards(v, generator) for k, v in columns.items()}
    raise ValueError(f"reward control {kind!r}: must be one of {', '.join(CONTROLS)}")
