"""Hand-computed tests for baselines and GRPO-family advantages, plus loop-twin equivalence."""

from __future__ import annotations

import math

import pytest
import torch

from rlplane.algorithms import (
    KLInReward,
    calculate_baseline_and_std_per_prompt,
    clip_advantages,
    gdpo_advantages,
    grpo_advantages,
    opd_advantages,
    raw_reward_advantages,
    reinforce_plus_plus_advantages,
    rloo_advantages,
)
from rlplane.algorithms._reference import baseline_and_std_loop

S2 = math.sqrt(2.0)


def close(a, b, tol=1e-5):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               atol=tol, rtol=tol)


# ---------------------------------------------------------------- baseline and std


def test_baseline_std_leave_one_out_group_of_four():
    # group rewards [1, 0, 0, 1] (LOO): sample 0 sees [0, 0, 1] -> b = 1/3,
    # var = (0 + 0 + 1)/3 - (1/3)^2 = 2/9 (biased), Bessel 3/2 -> 1/3, std = sqrt(1/3)
    # sample 1 sees [1, 0, 1] -> b = 2/3, std = sqrt((2/3 - 4/9)·3/2) = sqrt(1/3)
    p = torch.tensor([7, 7, 7, 7])
    b, s = calculate_baseline_and_std_per_prompt(p, torch.tensor([1.0, 0.0, 0.0, 1.0]))
    close(b, [1 / 3, 2 / 3, 2 / 3, 1 / 3])
    close(s, [math.sqrt(1 / 3)] * 4)


def test_baseline_std_without_leave_one_out():
    # [1, 0, 0, 1]: mean 0.5, unbiased var = (4·0.25)/3 = 1/3
    b, s = calculate_baseline_and_std_per_prompt(torch.zeros(4, dtype=torch.long), torch.tensor([1.0, 0.0, 0.0, 1.0]),
                                                 leave_one_out=False)
    close(b, [0.5] * 4)
    close(s, [math.sqrt(1 / 3)] * 4)


def test_baseline_groups_are_identical_rows_of_2d_prompts():
    # rows 0 and 2 are the same prompt; row 1 is alone (group of 1 -> baseline = reward, std 0)
    p = torch.tensor([[1, 2, 3], [1, 2, 4], [1, 2, 3]])
    b, s = calculate_baseline_and_std_per_prompt(p, torch.tensor([1.0, 5.0, 3.0]))
    close(b, [3.0, 5.0, 1.0])  # LOO: each sees the other
    close(s, [0.0, 0.0, 0.0])  # n = 2 with LOO: one sample -> std 0


def test_baseline_n2_loo_std_zero_means_no_normalisation():
    # n = 2, LOO: A = r - r_other, not divided (std = 0)
    a = grpo_advantages(torch.tensor([0, 0]), torch.tensor([1.0, 0.0]))
    close(a, [1.0, -1.0])


def test_baseline_valid_mask_excludes_samples():
    # group [1, 0, 9(invalid)]: valid n = 2 -> LOO baselines of the valid pair are each other's reward
    # the invalid sample sees both valid ones: b = (1 + 0)/2 = 0.5, std = sqrt(((0.5² + 0.5²)/2)·2/1) = sqrt(0.5)
    b, s = calculate_baseline_and_std_per_prompt(torch.tensor([0, 0, 0]), torch.tensor([1.0, 0.0, 9.0]),
                                                 torch.tensor([1, 1, 0]))
    close(b, [0.0, 1.0, 0.5])
    close(s, [0.0, 0.0, math.sqrt(0.5)])


def test_baseline_single_valid_sample_gets_its_own_reward():
    b, s = calculate_baseline_and_std_per_prompt(torch.tensor([0, 0]), torch.tensor([2.0, 3.0]), torch.tensor([1, 0]))
    close(b, [2.0, 3.0])
    close(s, [0.0, 0.0])


def test_baseline_all_equal_rewards_std_zero():
    b, s = calculate_baseline_and_std_per_prompt(torch.zeros(5, dtype=torch.long), torch.full((5,), 0.7))
    close(b, [0.7] * 5)
    close(s, [0.0] * 5)
    close(grpo_advantages(torch.zeros(5, dtype=torch.long), torch.full((5,), 0.7)), [0.0] * 5)


def test_baseline_empty_batch():
    b, s = calculate_baseline_and_std_per_prompt(torch.zeros(0, 3, dtype=torch.long), torch.zeros(0))
    assert b.shape == (0,) and s.shape == (0,)
    assert grpo_advantages(torch.zeros(0, dtype=torch.long), torch.zeros(0)).shape == (0,)


def test_baseline_std_keeps_precision_for_large_rewards():
    # rewards 1e6 + [0, 1, 2, 3]: LOO std of sample 0 is std([1, 2, 3]) = 1 exactly
    r = torch.tensor([1e6, 1e6 + 1, 1e6 + 2, 1e6 + 3], dtype=torch.float32)
    _, s = calculate_baseline_and_std_per_prompt(torch.zeros(4, dtype=torch.long), r)
    close(s[0], 1.0, tol=1e-4)


@pytest.mark.parametrize("shape", [(1, 1), (6, 3), (40, 5), (64, 16)])
@pytest.mark.parametrize("loo", [True, False])
def test_baseline_matches_loop_twin(shape, loo):
    g = torch.Generator().manual_seed(shape[0] * 7 + shape[1])
    b, group = shape
    prompt_ids = torch.randint(0, max(b // group, 1) + 1, (b, 2), generator=g)
    rewards = torch.randint(0, 3, (b,),
                            generator=g).float() + torch.rand(b, generator=g) * (torch.rand(b, generator=g) > 0.5)
    valid = (torch.rand(b, generator=g) > 0.2).float()
    got_b, got_s = calculate_baseline_and_std_per_prompt(prompt_ids, rewards.double(), valid, loo)
    ref_b, ref_s = baseline_and_std_loop(prompt_ids, rewards.double(), valid, loo)
    close(got_b, ref_b, tol=1e-9)
    close(got_s, ref_s, tol=1e-7)


# ---------------------------------------------------------------- GRPO / RLOO


def test_grpo_advantage_normalised_where_std_positive():
    # group A [1, 0, 0, 1] (LOO std sqrt(1/3)): A_0 = (1 - 1/3)/(sqrt(1/3) + 1e-6) = (2/3)·sqrt(3) = 1.1547
    # group B [0, 0] (n = 2 LOO, std 0): A = r - r_other = 0
    p = torch.tensor([0, 0, 0, 0, 1, 1])
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0])
    a = grpo_advantages(p, r)
    x = (2 / 3) / (math.sqrt(1 / 3) + 1e-6)
    close(a, [x, -x, -x, x, 0.0, 0.0])


def test_grpo_no_normalisation_and_no_baseline():
    p, r = torch.tensor([0, 0, 0]), torch.tensor([3.0, 0.0, 0.0])
    # normalize_rewards=False, LOO: b = [0, 1.5, 1.5] -> A = [3, -1.5, -1.5]
    close(grpo_advantages(p, r, normalize_rewards=False), [3.0, -1.5, -1.5])
    # minus_baseline=False, normalize: A = r / (std + 1e-6) where std > 0;
    # LOO std: s0 = 0 ([0, 0]), s1 = s2 = std([3, 0]) = 3/sqrt(2)
    std = 3 / S2
    close(grpo_advantages(p, r, minus_baseline=False), [3.0, 0.0, 0.0])
    close(grpo_advantages(p, r, minus_baseline=False, normalize_rewards=False), [3.0, 0.0, 0.0])
    # non-LOO: b = 1, std = sqrt(((2)^2 + 1 + 1)/2) = sqrt(3); A = [2, -1, -1]/sqrt(3)
    close(grpo_advantages(p, r, use_leave_one_out_baseline=False),
          [2 / (3**0.5 + 1e-6), -1 / (3**0.5 + 1e-6), -1 / (3**0.5 + 1e-6)])
    assert std > 0


def test_rloo_is_loo_baseline_without_std():
    # [1, 0, 0]: b = [0, 0.5, 0.5] -> A = [1, -0.5, -0.5]
    close(rloo_advantages(torch.tensor([0, 0, 0]), torch.tensor([1.0, 0.0, 0.0])), [1.0, -0.5, -0.5])


def test_clip_advantages():
    a = torch.tensor([-3.0, -0.5, 0.5, 3.0])
    close(clip_advantages(a, -1.0, 2.0), [-1.0, -0.5, 0.5, 2.0])
    close(clip_advantages(a, None, 1.0), [-3.0, -0.5, 0.5, 1.0])
    assert clip_advantages(a) is a


# ---------------------------------------------------------------- REINFORCE++


def test_reinforce_plus_plus_group_mean_then_global_whitening():
    # group [1, 0] (mean 0.5) -> A = [0.5, -0.5]; tokens: row 0 has 2 valid, row 1 has 1 valid
    # token values [0.5, 0.5, -0.5]; μ = 1/6; biased var = ((1/3)^2·2 + (2/3)^2)/3 = (2/9 + 4/9)/3 = 2/9
    # whitened: (0.5 - 1/6)/sqrt(2/9) = (1/3)/(sqrt(2)/3) = 1/sqrt(2); (-0.5 - 1/6)/sqrt(2/9) = -sqrt(2)
    tm = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    a = reinforce_plus_plus_advantages(torch.tensor([0, 0]), torch.tensor([1.0, 0.0]), tm)
    close(a, [[1 / S2, 1 / S2], [-S2, 0.0]])


def test_reinforce_plus_plus_kl_in_reward_and_no_baseline():
    # minus_baseline False: A = r = [1, 1] on all tokens; KL (k1 = prev - ref) per token = [[0, 1], [0, 0]]
    # β = 0.5 -> A = [[1, 0.5], [1, 1]]; μ = 3.5/4 = 0.875; biased var = (3·0.125² + 0.375²)/4 = 0.046875
    tm = torch.ones(2, 2)
    prev = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    ref = torch.tensor([[-1.0, -2.0], [-1.0, -1.0]])
    a = reinforce_plus_plus_advantages(
        torch.tensor([0, 0]), torch.tensor([1.0, 1.0]), tm, minus_baseline=False,
        kl_in_reward=KLInReward(0.5, "k1"), prev_logprobs=prev, reference_logprobs=ref,
    )
    sd = math.sqrt(0.046875)
    close(a, [[0.125 / sd, -0.375 / sd], [0.125 / sd, 0.125 / sd]])


def test_reinforce_plus_plus_all_equal_uses_variance_floor():
    # all A = 0 -> whitened 0 (var floored at 1e-8, no NaN)
    a = reinforce_plus_plus_advantages(torch.tensor([0, 0]), torch.tensor([1.0, 1.0]), torch.ones(2, 3))
    close(a, torch.zeros(2, 3))


# ---------------------------------------------------------------- GDPO


def test_gdpo_per_component_then_weighted_then_whitened():
    # two prompts of 2 samples, LOO n = 2 -> std 0 -> A_k = r - r_other
    # acc = [1, 0, 1, 1] -> A_acc = [1, -1, 0, 0]; fmt = [0, 1, 0, 0] -> A_fmt = [-1, 1, 0, 0]
    # weights (acc 2, fmt 1): A = [1, -1, 0, 0]; mean 0, unbiased std = sqrt(2/3) -> A / sqrt(2/3)
    p = torch.tensor([0, 0, 1, 1])
    comps = {"fmt": torch.tensor([0.0, 1.0, 0.0, 0.0]), "acc": torch.tensor([1.0, 0.0, 1.0, 1.0])}
    a = gdpo_advantages(p, comps, reward_weights=[2.0, 1.0])  # alphabetical: acc, fmt
    sd = math.sqrt(2 / 3)
    close(a, [1 / sd, -1 / sd, 0.0, 0.0])


def test_gdpo_needs_two_components_and_matching_weights():
    with pytest.raises(ValueError, match="at least 2"):
        gdpo_advantages(torch.tensor([0, 0]), {"acc": torch.tensor([1.0, 0.0])})
    with pytest.raises(ValueError, match="reward_weights"):
        gdpo_advantages(torch.tensor([0, 0]), {"a": torch.zeros(2), "b": torch.zeros(2)}, reward_weights=[1.0])


def test_gdpo_all_equal_is_zero_not_nan():
    p = torch.tensor([0, 0])
    close(gdpo_advantages(p, {"a": torch.ones(2), "b": torch.zeros(2)}), [0.0, 0.0])


def test_gdpo_normalize_rewards_false_skips_the_per_component_std():
    # issue 16 item 9 (NeMo RL GDPOAdvantageEstimator: normalize_rewards gates the per-component
    # division; the final batch whitening always runs). One group of 4, LOO.
    # a = [1, 0, 0, 0]: b = [0, 1/3, 1/3, 1/3] -> A_a = [1, −1/3, −1/3, −1/3]
    # b = [1, 1, 0, 0]: b = [1/3, 1/3, 2/3, 2/3] -> A_b = [2/3, 2/3, −2/3, −2/3]
    # sum = [5/3, 1/3, −1, −1]; mean 0; unbiased var = (25/9 + 1/9 + 1 + 1)/3 = 44/27
    p = torch.zeros(4, dtype=torch.long)
    comps = {"a": torch.tensor([1.0, 0.0, 0.0, 0.0]), "b": torch.tensor([1.0, 1.0, 0.0, 0.0])}
    sd = math.sqrt(44 / 27)
    close(gdpo_advantages(p, comps, normalize_rewards=False), [5 / 3 / sd, 1 / 3 / sd, -1 / sd, -1 / sd])
    # normalised: A_a = [1, −y, −y, −y] (sample 0 sees [0, 0, 0]: std 0), y = (1/3)/(sqrt(1/3) + 1e-6);
    # A_b = [z, z, −z, −z], z = (2/3)/(sqrt(1/3) + 1e-6); sum = [1 + z, z − y, −y − z, −y − z]
    y, z = (1 / 3) / (math.sqrt(1 / 3) + 1e-6), (2 / 3) / (math.sqrt(1 / 3) + 1e-6)
    s = torch.tensor([1 + z, z - y, -y - z, -y - z], dtype=torch.float64)
    close(gdpo_advantages(p, comps), (s - s.mean()) / s.std())


# ---------------------------------------------------------------- raw reward / OPD


def test_raw_reward_advantages():
    # issue 16 item 7: NeMo RL's RawRewardAdvantageEstimator whitens with the *biased* masked
    # variance and rsqrt(clamp(var, 1e-8)).
    # r = [1, 0]; tokens [[1, 1], [1, 0]] -> values [1, 1, 0]; μ = 2/3;
    # biased var = (2·(1/3)² + (2/3)²)/3 = (2/9 + 4/9)/3 = 2/9 -> sd = sqrt(2)/3
    # A = (1/3)/(sqrt(2)/3) = 1/sqrt(2), (−2/3)/(sqrt(2)/3) = −sqrt(2)   (unbiased var 1/3 gave 0.577/−1.155)
    tm = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    a = raw_reward_advantages(torch.tensor([1.0, 0.0]), tm)
    close(a, [[1 / S2, 1 / S2], [-S2, 0.0]])
    close(raw_reward_advantages(torch.tensor([1.0, 0.0]), tm, normalize_advantages=False), [[1.0, 1.0], [0.0, 0.0]])


def test_raw_reward_advantages_variance_is_clamped_not_shifted():
    # rewards [1 + 1e-5, 1]: values [1 + 1e-5, 1], μ = 1 + 5e-6, biased var = (5e-6)² = 2.5e-11 < 1e-8
    # clamp: rsqrt(1e-8) = 1e4 -> A = ±5e-6·1e4 = ±0.05   (var + 1e-8 would give ±0.049999999)
    # and one valid token: var = 0 -> clamped -> A = 0, not NaN
    a = raw_reward_advantages(torch.tensor([1.0 + 1e-5, 1.0], dtype=torch.float64),
                              torch.ones(2, 1, dtype=torch.float64))
    torch.testing.assert_close(a, torch.tensor([[0.05], [-0.05]], dtype=torch.float64), atol=1e-12, rtol=1e-12)
    close(raw_reward_advantages(torch.tensor([3.0]), torch.ones(1, 2)), [[0.0, 0.0]])


def test_opd_advantages():
    # (teacher - prev)·mask: [[-1 - (-2), ...]]
    a = opd_advantages(torch.tensor([[-1.0, -3.0]]), torch.tensor([[-2.0, -1.0]]), torch.tensor([[1.0, 0.0]]))
    close(a, [[1.0, 0.0]])
