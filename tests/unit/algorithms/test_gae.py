"""Hand-computed GAE tests (carry-forward masking, KL reward, decoupled and adaptive λ) and the loop twin."""

from __future__ import annotations

import math

import pytest
import torch

from rlplane.algorithms import KLInReward, compute_gae, length_adaptive_lambda
from rlplane.algorithms._reference import gae_loop

# one sequence: [prompt, response, response, padding]
MASK = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
VALUES = torch.tensor([[9.0, 1.0, 2.0, 7.0]])
REWARD = torch.tensor([3.0])


def close(a, b, tol=1e-5):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               atol=tol, rtol=tol)


def test_gae_hand_computed_with_prompt_and_padding():
    # γ = 1, λ = 0.5; reward 3 on the last valid token (t = 2)
    # t=3 padding: carried (next_v = 0, gae = 0)
    # t=2: δ = 3 + 1·0 − 2 = 1 -> A = 1 ; next_v = 2
    # t=1: δ = 0 + 1·2 − 1 = 1 -> A = 1 + 1·0.5·1 = 1.5
    # returns R = A + V = [1.5 + 1, 1 + 2] = [2.5, 3]
    adv, ret = compute_gae(REWARD, VALUES, MASK, gae_gamma=1.0, gae_lambda=0.5, normalize_advantages=False)
    close(adv, [[0.0, 1.5, 1.0, 0.0]])
    close(ret[MASK.bool()], [2.5, 3.0])


def test_gae_discount():
    # γ = 0.9, λ = 0.5: t=2: δ = 3 − 2 = 1; t=1: δ = 0.9·2 − 1 = 0.8, A = 0.8 + 0.9·0.5·1 = 1.25
    adv, _ = compute_gae(REWARD, VALUES, MASK, gae_gamma=0.9, gae_lambda=0.5, normalize_advantages=False)
    close(adv, [[0.0, 1.25, 1.0, 0.0]])


def test_gae_skips_environment_tokens_in_multi_turn():
    # mask [1, 0, 1] (t=1 is an environment observation with value 5, skipped), r = 1, γ = λ = 1
    # t=2: δ = 1 − 2 = −1 -> A = −1, next_v = 2 ; t=1: carried ; t=0: δ = 0 + 2 − 1 = 1, A = 1 + (−1) = 0
    adv, ret = compute_gae(torch.tensor([1.0]), torch.tensor([[1.0, 5.0, 2.0]]), torch.tensor([[1.0, 0.0, 1.0]]),
                           gae_gamma=1.0, gae_lambda=1.0, normalize_advantages=False)
    close(adv, [[0.0, 0.0, -1.0]])
    close(ret[0, [0, 2]], [1.0, 1.0])  # Monte-Carlo return 1 everywhere with γ = λ = 1


def test_gae_kl_penalty_in_reward():
    # k1 = prev − ref per token = [0, 0, 1, 0]; β = 0.1 -> r_2 = 3 − 0.1 = 2.9
    # t=2: δ = 2.9 − 2 = 0.9; t=1: δ = 2 − 1 = 1, A = 1 + 0.5·0.9 = 1.45
    prev = torch.tensor([[0.0, -1.0, -1.0, 0.0]])
    ref = torch.tensor([[0.0, -1.0, -2.0, 0.0]])
    adv, _ = compute_gae(REWARD, VALUES, MASK, gae_lambda=0.5, normalize_advantages=False,
                         kl_in_reward=KLInReward(0.1, "k1"), prev_logprobs=prev, reference_logprobs=ref)
    close(adv, [[0.0, 1.45, 0.9, 0.0]])


def test_gae_decoupled_lambdas():
    # returns with λ_value = 1: t=2 A=1, t=1 A = 1 + 1 = 2 -> R = [2 + 1, 1 + 2] = [3, 3]
    # advantages with λ_policy = 0: one-step TD errors [1, 1]
    adv, ret = compute_gae(REWARD, VALUES, MASK, gae_lambda_value=1.0, gae_lambda_policy=0.0,
                           normalize_advantages=False)
    close(adv, [[0.0, 1.0, 1.0, 0.0]])
    close(ret[MASK.bool()], [3.0, 3.0])


def test_length_adaptive_lambda():
    # L = 2: α = 0.5 -> 1 − 1/max(1, 1) = 0 ; α = 1 -> 1 − 1/2 = 0.5 ; α = 0.1 -> α·L = 0.2 -> clamp 1 -> 0
    close(length_adaptive_lambda(MASK, 0.5), [0.0])
    close(length_adaptive_lambda(MASK, 1.0), [0.5])
    close(length_adaptive_lambda(MASK, 0.1), [0.0])
    # α = 1 -> λ_policy = 0.5 -> advantages as in the first test; returns still use gae_lambda = 1
    adv, ret = compute_gae(REWARD, VALUES, MASK, gae_lambda=1.0, length_adaptive_alpha=1.0, normalize_advantages=False)
    close(adv, [[0.0, 1.5, 1.0, 0.0]])
    close(ret[MASK.bool()], [3.0, 3.0])


def test_gae_whitening():
    # A = [1.5, 1] on valid tokens: μ = 1.25, unbiased var = 2·0.25²/1 = 0.125 -> ±0.25/sqrt(0.125 + 1e-8)
    adv, _ = compute_gae(REWARD, VALUES, MASK, gae_lambda=0.5)
    x = 0.25 / math.sqrt(0.125 + 1e-8)
    close(adv, [[0.0, x, -x, 0.0]])


def test_gae_empty_rows_and_batch():
    adv, ret = compute_gae(torch.tensor([1.0, 2.0]), torch.ones(2, 3), torch.tensor([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    close(adv[0], [0.0, 0.0, 0.0])
    adv, ret = compute_gae(torch.zeros(0), torch.zeros(0, 4), torch.zeros(0, 4))
    assert adv.shape == ret.shape == (0, 4)


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (8, 16), (5, 40)])
@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.9, 0.5), (0.99, 1.0)])
def test_gae_matches_loop_twin(shape, gamma, lam):
    g = torch.Generator().manual_seed(shape[0] * 100 + shape[1])
    b, t = shape
    values = torch.randn(b, t, generator=g, dtype=torch.float64)
    mask = (torch.rand(b, t, generator=g) > 0.3).double()
    rewards = torch.randn(b, generator=g, dtype=torch.float64)
    adv, ret = compute_gae(rewards, values, mask, gae_gamma=gamma, gae_lambda=lam, normalize_advantages=False)
    ref_adv, ref_ret = gae_loop(rewards, values, mask, gamma, lam)
    close(adv, ref_adv, tol=1e-9)
    close(ret[mask.bool()], ref_ret[mask.bool()], tol=1e-9)
    # length-adaptive λ per sample
    alpha = 0.3
    adv, _ = compute_gae(rewards, values, mask, gae_gamma=gamma, length_adaptive_alpha=alpha,
                         normalize_advantages=False)
    lams = [max(0.0, min(1.0, 1 - 1 / max(alpha * float(mask[i].sum()), 1.0))) for i in range(b)]
    close(adv, gae_loop(rewards, values, mask, gamma, lams)[0], tol=1e-6)
