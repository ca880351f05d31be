"""GRPO advantages stay within the bound their normalisation implies (issue 16, item 1).

A leave-one-out std that should be exactly 0 (the other rewards of the group are all equal) used
to come out as a float64 rounding residue (≈ 7e-9) and was then divided by ``std + 1e-6``:
``[1, 0, 1]`` gave ``[0.707, -992604, 0.707]``. These tests sweep group sizes 1..16 and reward
grids (0/1, 0.2 steps, 0.05 steps, multiples of 1/3) and assert the bound below.

The bound. Let sample i's baseline use the k other rewards (k = G − 1 with leave-one-out), all on
a grid of step h inside a range of width R, with mean b and unbiased std s.

- If the others are all equal, s = 0 exactly, no normalisation: ``|A_i| = |r_i − b| ≤ R``.
- Otherwise ``Σ_j (x_j − x̄)² = (1/2k)·Σ_{j,l} (x_j − x_l)²``; at least 2(k − 1) ordered pairs
  differ (a split into m and k − m distinct values has m(k − m) ≥ k − 1 pairs each way), each by
  ≥ h, so ``Σ_j (x_j − x̄)² ≥ (k − 1)·h²/k`` and ``s² ≥ h²/k``. With ``|r_i − b| ≤ R``:
  ``|A_i| ≤ R/s ≤ (R/h)·sqrt(k) = (R/h)·sqrt(G − 1)``.

So for 0/1 rewards ``|A| ≤ sqrt(G − 1)``, for 0.2 steps ``5·sqrt(G − 1)``, for 0.05 steps
``20·sqrt(G − 1)`` and for thirds ``3·sqrt(G − 1)`` (the ``+1e-6`` in the denominator only
shrinks A). Without leave-one-out the std is over the whole group including r_i, and Samuelson's
inequality gives ``|r_i − mean| ≤ s·(G − 1)/sqrt(G)`` whatever the grid.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from rlplane.algorithms import calculate_baseline_and_std_per_prompt, gdpo_advantages, grpo_advantages
from rlplane.algorithms._reference import baseline_and_std_loop

# name -> (grid values as a user's reward function computes them, R / h)
GRIDS = {
    "binary": ([0.0, 1.0], 1.0),
    "step_0.2": ([i * 0.2 for i in range(6)], 5.0),
    "step_0.05": ([i * 0.05 for i in range(21)], 20.0),
    "thirds": ([i / 3 for i in range(4)], 3.0),
}
SLACK = 1e-6  # relative: grid values such as 3·0.2 = 0.6000000000000001 are off by an ulp


def outlier_groups(values: list[float], g: int, seed: int) -> list[list[float]]:
    """Groups of size g: for every (base, outlier) pair of values, one outlier at every position
    and two at positions (0, p) for every p and at the last two (all 2^g subsets for binary
    rewards and g ≤ 10), plus 64 seeded random groups."""
    groups: list[list[float]] = []
    if len(values) == 2 and g <= 10:
        groups = [[values[bit] for bit in bits] for bits in itertools.product((0, 1), repeat=g)]
    else:
        placements = [(p,) for p in range(g)] + [(0, p) for p in range(1, g)] + ([(g - 2, g - 1)] if g > 2 else [])
        for base, odd in itertools.permutations(values, 2):
            for pos in placements:
                groups.append([odd if j in pos else base for j in range(g)])
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, len(values), (64, g), generator=gen)
    groups += [[values[int(j)] for j in row] for row in idx]
    return groups


def batch_of(groups: list[list[float]], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = len(groups[0])
    prompt_ids = torch.arange(len(groups)).repeat_interleave(g)  # (N·g,)
    return prompt_ids, torch.tensor(groups, dtype=dtype).reshape(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("grid", sorted(GRIDS))
@pytest.mark.parametrize("g", range(1, 17))
def test_loo_advantage_within_grid_bound(g, grid, dtype):
    values, r_over_h = GRIDS[grid]
    prompt_ids, rewards = batch_of(outlier_groups(values, g, seed=g), dtype)
    adv = grpo_advantages(prompt_ids, rewards)
    bound = r_over_h * math.sqrt(max(g - 1, 1)) * (1 + SLACK)
    worst = adv.abs().max().item()
    assert torch.isfinite(adv).all()
    assert worst <= bound, f"G={g} {grid}: max |A| = {worst} > bound {bound}"


@pytest.mark.parametrize("grid", sorted(GRIDS))
@pytest.mark.parametrize("g", range(2, 17))
def test_loo_std_exactly_zero_when_the_others_are_equal(g, grid):
    # every group here is "all c except sample 0 = d": sample 0's others are all c, so its std is
    # exactly 0 and its advantage is exactly d − c (no division by a residue + 1e-6)
    values, _ = GRIDS[grid]
    groups = [[d] + [c] * (g - 1) for c, d in itertools.permutations(values, 2)]
    prompt_ids, rewards = batch_of(groups, torch.float64)
    baseline, std = calculate_baseline_and_std_per_prompt(prompt_ids, rewards)
    first = torch.arange(len(groups)) * g
    assert (std[first] == 0).all()
    assert torch.equal(baseline[first], rewards[first + 1])  # the baseline is c itself, not Σc/k
    adv = grpo_advantages(prompt_ids, rewards)
    assert torch.equal(adv[first], rewards[first] - rewards[first + 1])


@pytest.mark.parametrize("grid", sorted(GRIDS))
@pytest.mark.parametrize("g", range(1, 17))
def test_whole_group_advantage_within_samuelson_bound(g, grid):
    values, _ = GRIDS[grid]
    prompt_ids, rewards = batch_of(outlier_groups(values, g, seed=100 + g), torch.float64)
    adv = grpo_advantages(prompt_ids, rewards, use_leave_one_out_baseline=False)
    bound = (g - 1) / math.sqrt(g) * (1 + SLACK) if g > 1 else 0.0
    assert adv.abs().max().item() <= bound + 1e-12
    _, std = calculate_baseline_and_std_per_prompt(prompt_ids, rewards, leave_one_out=False)
    equal = (rewards.reshape(-1, g) == rewards.reshape(-1, g)[:, :1]).all(dim=1).repeat_interleave(g)
    assert (std[equal] == 0).all()  # an all-equal group has std exactly 0, not a residue


def test_nemo_numbers_group_of_three():
    # [1, 0, 1] (issue 16 item 1): sample 0 sees [0, 1]: b = 0.5, s = sqrt(0.5) -> 0.5/(0.70711 + 1e-6)
    # sample 1 sees [1, 1]: s = 0 exactly -> A = 0 − 1 = −1 (NeMo RL's number; was −992604)
    adv = grpo_advantages(torch.zeros(3, dtype=torch.long), torch.tensor([1.0, 0.0, 1.0]))
    x = 0.5 / (math.sqrt(0.5) + 1e-6)
    torch.testing.assert_close(adv, torch.tensor([x, -1.0, x]))


def test_nemo_numbers_group_of_six_one_success():
    # [1, 0, 0, 0, 0, 0]: sample 0 sees five 0s -> s = 0 -> A = 1 (was +995852)
    # a 0 sees [1, 0, 0, 0, 0]: b = 0.2, unbiased var = (0.2 − 0.04)·5/4 = 0.2 -> A = −0.2/(sqrt(0.2) + 1e-6)
    adv = grpo_advantages(torch.zeros(6, dtype=torch.long), torch.tensor([1.0, 0, 0, 0, 0, 0]))
    y = -0.2 / (math.sqrt(0.2) + 1e-6)
    torch.testing.assert_close(adv, torch.tensor([1.0] + [y] * 5))


def test_partial_credit_group_of_four():
    # [0.2, 0.2, 0.2, 1.0]: sample 3 sees three 0.2s (std exactly 0) -> A = 1.0 − 0.2 = 0.8
    # a 0.2 sees [0.2, 0.2, 1.0]: b = 1.4/3, unbiased var = (2·(0.2 − b)² + (1 − b)²)/2 = 0.64/3
    # -> A = (0.2 − 1.4/3)/(sqrt(0.64/3) + 1e-6)
    adv = grpo_advantages(torch.zeros(4, dtype=torch.long), torch.tensor([0.2, 0.2, 0.2, 1.0], dtype=torch.float64))
    y = (0.2 - 1.4 / 3) / (math.sqrt(0.64 / 3) + 1e-6)
    torch.testing.assert_close(adv, torch.tensor([y, y, y, 0.8], dtype=torch.float64))


def test_valid_mask_others_equal_is_exact():
    # [1, 0, 1, 7(invalid)]: the invalid reward never enters; sample 1 still sees [1, 1] -> A = −1
    adv = grpo_advantages(torch.zeros(4, dtype=torch.long), torch.tensor([1.0, 0.0, 1.0, 7.0]),
                          torch.tensor([1, 1, 1, 0]))
    x = 0.5 / (math.sqrt(0.5) + 1e-6)
    torch.testing.assert_close(adv[:3], torch.tensor([x, -1.0, x]))


@pytest.mark.parametrize("grid", sorted(GRIDS))
def test_loop_twin_agrees_on_exact_zero_std(grid):
    values, _ = GRIDS[grid]
    gen = torch.Generator().manual_seed(len(values))
    prompt_ids = torch.randint(0, 40, (300,), generator=gen)
    rewards = torch.tensor(values, dtype=torch.float64)[torch.randint(0, len(values), (300,), generator=gen)]
    rewards = torch.where(torch.rand(300, generator=gen) < 0.5, torch.full_like(rewards, values[-1]), rewards)
    valid = (torch.rand(300, generator=gen) > 0.1).float()
    for loo in (True, False):
        got_b, got_s = calculate_baseline_and_std_per_prompt(prompt_ids, rewards, valid, loo)
        ref_b, ref_s = baseline_and_std_loop(prompt_ids, rewards, valid, loo)
        assert torch.equal(got_s == 0, ref_s == 0)
        torch.testing.assert_close(got_b, ref_b, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(got_s, ref_s, atol=1e-9, rtol=1e-9)


def test_gdpo_goes_through_the_exact_path():
    # components a = [1, 0, 1], b = [0, 0, 1] in one group of 3, LOO + per-component std:
    # A_a = [x, −1, x] (x = 0.5/(sqrt(0.5) + 1e-6)); A_b = [−x, −x, 1] (sample 2 sees [0, 0]: s = 0)
    # sum = [0, −1 − x, 1 + x]; mean 0; unbiased std = sqrt(2·(1 + x)²/2) = 1 + x -> [0, −1, 1]
    comps = {"a": torch.tensor([1.0, 0.0, 1.0]), "b": torch.tensor([0.0, 0.0, 1.0])}
    adv = gdpo_advantages(torch.zeros(3, dtype=torch.long), comps)
    torch.testing.assert_close(adv, torch.tensor([0.0, -1.0, 1.0]))
