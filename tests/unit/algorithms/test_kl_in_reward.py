"""KLInReward: the KL-in-reward options (β, estimator, clamps), their rules, and the numbers REINFORCE++ and GAE
give with them: the same as the estimate spelled out by hand."""

from __future__ import annotations

import pytest
import torch

from rlplane.algorithms import (
    ClippedPGOptions,
    KLInReward,
    calculate_baseline_and_std_per_prompt,
    compute_gae,
    gae_token_rewards,
    kl_estimate,
    reinforce_plus_plus_advantages,
    reward_kl,
)
from rlplane.algorithms._ops import masked_whiten
from rlplane.algorithms.advantages import REINFORCE_PP_VAR_FLOOR


def test_built_from_the_loss_options_only_when_on():
    assert ClippedPGOptions().kl_in_reward is None  # use_kl_in_reward off by default
    assert ClippedPGOptions(use_kl_in_reward=True, reference_policy_kl_penalty=0.0).kl_in_reward is None
    on = ClippedPGOptions(use_kl_in_reward=True, reference_policy_kl_penalty=0.05, reference_policy_kl_type="k2",
                          kl_input_clamp_value=None, kl_output_clamp_value=3.0)
    assert on.kl_in_reward == KLInReward(beta=0.05, kl_type="k2", input_clamp_value=None, output_clamp_value=3.0)
    assert on.kl_beta == 0.0  # the loss's own KL term is off


def test_defaults_are_the_loss_fn_defaults():
    o = ClippedPGOptions()
    assert KLInReward(beta=o.reference_policy_kl_penalty) == KLInReward(
        o.reference_policy_kl_penalty, o.reference_policy_kl_type, o.kl_input_clamp_value, o.kl_output_clamp_value)


def test_every_broken_rule_is_one_line():
    with pytest.raises(ValueError) as exc:
        KLInReward(beta=-0.1, kl_type="k4", input_clamp_value=0.0, output_clamp_value=-1.0)
    lines = str(exc.value).splitlines()
    assert lines == [
        "beta = -0.1: needs β >= 0 (loss_fn.reference_policy_kl_penalty)",
        "kl_type = 'k4': unknown estimator; use one of k1, k2, k3",
        "input_clamp_value = 0.0: needs a positive bound; use a value > 0 or None for no clamp",
        "output_clamp_value = -1.0: needs a positive bound; use a value > 0 or None for no clamp",
    ]
    with pytest.raises(AttributeError):  # frozen
        KLInReward(0.1).beta = 0.2


def _inputs(seed: int = 0, b: int = 5, t: int = 9):
    g = torch.Generator().manual_seed(seed)
    prev = -torch.rand(b, t, generator=g) * 3
    ref = prev + torch.randn(b, t, generator=g) * 4  # wide enough for the clamps to act
    mask = (torch.rand(b, t, generator=g) > 0.3).float()
    return prev, ref, mask, torch.randn(b, generator=g), torch.randn(b, t, generator=g), torch.arange(b) // 2


@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3"])
@pytest.mark.parametrize("clamps", [(20.0, 10.0), (0.5, 0.3), (None, None)])
def test_same_numbers_as_the_estimate_spelled_out(kl_type, clamps):
    prev, ref, mask, rewards, values, groups = _inputs()
    k = KLInReward(0.07, kl_type, *clamps)
    kl = kl_estimate(prev, ref, kl_type, *clamps)  # (B, T)
    masked = torch.where(mask != 0, kl, torch.zeros_like(kl))
    assert torch.equal(reward_kl(k, prev, ref, mask), masked)

    # GAE's token rewards: −β·KL on the mask, the scalar reward on the last valid token.
    plain = gae_token_rewards(rewards, mask)
    expected = torch.where(mask != 0, (plain - 0.07 * masked) * mask, torch.zeros_like(plain))
    got = gae_token_rewards(rewards, mask, kl_in_reward=k, prev_logprobs=prev, reference_logprobs=ref)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-7)
    adv, ret = compute_gae(rewards, values, mask, kl_in_reward=k, prev_logprobs=prev, reference_logprobs=ref)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()

    # REINFORCE++: A = r − mean_group(r) per token, minus β·KL, whitened over the mask.
    no_kl = reinforce_plus_plus_advantages(groups, rewards, mask)
    with_kl = reinforce_plus_plus_advantages(groups, rewards, mask, kl_in_reward=k, prev_logprobs=prev,
                                             reference_logprobs=ref)
    beta_zero = reinforce_plus_plus_advantages(groups, rewards, mask, kl_in_reward=KLInReward(0.0, kl_type, *clamps),
                                               prev_logprobs=prev, reference_logprobs=ref)
    assert torch.equal(beta_zero, no_kl) and not torch.equal(with_kl, no_kl)
    baseline, _ = calculate_baseline_and_std_per_prompt(groups, rewards, None, leave_one_out=False)
    adv = (rewards - baseline)[:, None].expand(mask.shape)  # (B, T)
    expected = masked_whiten(adv - 0.07 * masked, mask, unbiased=False, eps=REINFORCE_PP_VAR_FLOOR, clamp_var=True)
    assert torch.equal(with_kl, expected)


def test_kl_in_reward_needs_both_logprobs():
    prev, ref, mask, rewards, values, groups = _inputs()
    with pytest.raises(ValueError, match="needs prev_logprobs and reference_logprobs"):
        compute_gae(rewards, values, mask, kl_in_reward=KLInReward(0.1), prev_logprobs=prev)
    with pytest.raises(ValueError, match="needs prev_logprobs and reference_logprobs"):
        reinforce_plus_plus_advantages(groups, rewards, mask, kl_in_reward=KLInReward(0.1), reference_logprobs=ref)
