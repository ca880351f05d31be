"""Reward controls: rewards that carry no information about which response earned them."""

from __future__ import annotations

import pytest
import torch

from rlplane.algorithms.controls import coin_rewards, control_generator, control_rewards, permute_rewards


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_permute_keeps_the_batch_and_moves_every_column_together():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.0])
    fmt = torch.tensor([0.5, 0.0, 0.0, 0.5, 0.5, 0.0])
    acc = rewards - fmt  # components that add up to the total
    out = permute_rewards({"rewards": rewards, "reward/format": fmt, "reward/acc": acc}, _gen(3))
    assert sorted(out["rewards"].tolist()) == sorted(rewards.tolist())  # the same multiset, so the same mean
    assert torch.equal(out["reward/format"] + out["reward/acc"], out["rewards"])  # one permutation for all
    assert not torch.equal(out["rewards"], rewards)  # seed 3 moves something (checked: a fixed draw)


def test_permute_refuses_columns_of_different_lengths():
    with pytest.raises(ValueError, match="different lengths"):
        permute_rewards({"rewards": torch.zeros(3), "reward/x": torch.zeros(4)}, _gen())


def test_coin_matches_the_batch_mean_in_expectation():
    # 0/1 rewards, mean 3/5 = 0.6: each sample a Bernoulli(0.6) coin.
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0])
    draws = torch.stack([coin_rewards(rewards, _gen(i)) for i in range(4000)])  # (4000, 5)
    assert set(draws.unique().tolist()) == {0.0, 1.0}
    assert abs(draws.mean().item() - 0.6) < 0.02  # sd of the mean: sqrt(.24 / 20000) = 0.0035
    # Non-binary: lo 0.5, hi 1.5, mean (0.5 + 1.5 + 1.0) / 3 = 1.0, p = (1.0 - 0.5) / (1.5 - 0.5) = 0.5.
    rewards = torch.tensor([0.5, 1.5, 1.0])
    draws = torch.stack([coin_rewards(rewards, _gen(i)) for i in range(4000)])
    assert set(draws.unique().tolist()) == {0.5, 1.5}
    assert abs(draws.mean().item() - 1.0) < 0.03  # sd: 0.5 / sqrt(12000) = 0.0046


def test_coin_leaves_an_all_equal_batch_and_an_empty_one_alone():
    assert torch.equal(coin_rewards(torch.full((4,), 0.25), _gen()), torch.full((4,), 0.25))
    assert coin_rewards(torch.zeros(0), _gen()).shape == (0,)


def test_a_control_carries_no_information_about_the_responses():
    # Responses "right" (reward 1) on a fixed half of the batch: under either control, the reward a sample gets is
    # uncorrelated with whether it was right (over 500 batches of 8).
    right = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    for kind in ("permute", "coin"):
        got = torch.stack([control_rewards(kind, {"rewards": right}, _gen(i))["rewards"] for i in range(500)])
        corr = torch.corrcoef(torch.stack([right.repeat(500), got.flatten()]))[0, 1]
        assert abs(corr.item()) < 0.06, (kind, corr)  # sd of a null correlation over 4000 pairs: 0.016


def test_the_draw_depends_on_the_seed_and_the_batch_keys_only():
    ids = [f"p{i}_g{j}" for i in range(4) for j in range(4)]
    rewards = torch.arange(16.0)
    a = control_rewards("permute", {"rewards": rewards}, control_generator(42, ids))["rewards"]
    torch.manual_seed(123)  # the global stream does not matter
    b = control_rewards("permute", {"rewards": rewards}, control_generator(42, ids))["rewards"]
    c = control_rewards("permute", {"rewards": rewards}, control_generator(43, ids))["rewards"]
    d = control_rewards("permute", {"rewards": rewards}, control_generator(42, ids[::-1]))["rewards"]
    assert torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(a, d)
    assert control_generator(2**64 - 1, ids).initial_seed() < 2**63  # any seed the config accepts


def test_an_unknown_control_is_refused():
    with pytest.raises(ValueError, match="must be one of permute, coin"):
        control_rewards("zero", {"rewards": torch.zeros(2)}, _gen())
