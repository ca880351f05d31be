"""The pure pieces of the PPO recipe: estimator dispatch, metric combination over epochs, critic metrics."""

from __future__ import annotations

import math

import pytest
import torch

from rlplane.algorithms.gae import compute_gae
from rlplane.recipes.ppo import critic_metrics, mean_over_epochs, ppo_advantages

GAE = dict(gae_gamma=1.0, gae_lambda=1.0, gae_lambda_value=None, gae_lambda_policy=None, length_adaptive_alpha=0.0,
           normalize_advantages=False)


def test_gae_estimator_hand_computed():
    # One sequence, prompt token then 2 response tokens; reward 1 on the last one; γ = λ = 1.
    # V = [0, 0.2, 0.5]; mask = [0, 1, 1].
    # t=2: δ = 1 + 0 − 0.5 = 0.5, A = 0.5;   t=1: δ = 0 + 0.5 − 0.2 = 0.3, A = 0.3 + 0.5 = 0.8
    # t=0 (masked): carries A = 0.8 but is zeroed in the output.   R = A + V: [_, 1.0, 1.0]
    rewards = torch.tensor([1.0])
    values = torch.tensor([[0.0, 0.2, 0.5]])
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    adv, ret = ppo_advantages("gae", rewards, mask, values, GAE)
    torch.testing.assert_close(adv, torch.tensor([[0.0, 0.8, 0.5]]))
    torch.testing.assert_close(ret[:, 1:], torch.tensor([[1.0, 1.0]]))


def test_gae_estimator_equals_compute_gae_with_whitening():
    g = torch.Generator().manual_seed(0)
    rewards, values = torch.rand(6, generator=g), torch.randn(6, 9, generator=g)
    mask = (torch.rand(6, 9, generator=g) > 0.3).float()
    kw = {**GAE, "gae_lambda": 0.95, "normalize_advantages": True}
    a1, r1 = ppo_advantages("gae", rewards, mask, values, kw)
    a2, r2 = compute_gae(rewards, values, mask, **kw)
    torch.testing.assert_close(a1, a2)
    torch.testing.assert_close(r1, r2)


def test_raw_reward_estimator_needs_no_values():
    # A_t = r on the masked tokens, no returns (no critic): rewards [1, 0], mask of 2 and 1 tokens.
    adv, ret = ppo_advantages("raw_reward", torch.tensor([1.0, 0.0]), torch.tensor([[0.0, 1, 1], [0, 1, 0]]), None,
                              {**GAE, "normalize_advantages": False})
    assert ret is None
    torch.testing.assert_close(adv, torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))


def test_mean_over_epochs_means_sums_and_takes_extrema():
    per_epoch = [{"loss": 1.0, "probs_ratio_min": 0.9, "probs_ratio_max": 1.1},
                 {"loss": 3.0, "probs_ratio_min": 0.7, "probs_ratio_max": 1.4}]
    assert mean_over_epochs(per_epoch) == {"loss": 2.0, "probs_ratio_min": 0.7, "probs_ratio_max": 1.4}
    assert mean_over_epochs([]) == {}


def _value_metrics(loss, values_mean, returns_mean, returns_sq_mean, residual_sq_mean):
    return {"loss": loss, "vf_clipfrac": 0.5 * loss, "grad_norm": 1.0, "lr": 1e-3, "values_mean": values_mean,
            "values_min": -1.0, "values_max": 1.0, "returns_mean": returns_mean, "returns_sq_mean": returns_sq_mean,
            "residual_sq_mean": residual_sq_mean, "num_valid_samples": 4.0, "global_valid_toks": 8.0,
            "global_valid_seqs": 4.0}


def test_critic_metrics_explained_variance_from_first_epoch():
    # Epoch 1: μ_R = 0.5, E[R²] = 0.5 → Var(R) = 0.25; E[(R−V)²] = 0.1, μ_V = 0.3 → Var(R−V) = 0.1 − 0.04 = 0.06
    # EV = 1 − 0.06 / 0.25 = 0.76. Epoch 2 (better fitted) must not change the reported EV.
    m = critic_metrics([_value_metrics(0.2, 0.3, 0.5, 0.5, 0.1), _value_metrics(0.1, 0.5, 0.5, 0.5, 0.01)])
    assert m["critic/explained_var"] == pytest.approx(0.76)
    assert m["value_loss"] == pytest.approx(0.15)  # mean over the two epochs
    assert m["vf_clipfrac"] == pytest.approx(0.075)
    assert m["values_mean"] == 0.3 and m["returns_mean"] == 0.5
    assert m["returns_std"] == pytest.approx(math.sqrt(0.25))
    assert critic_metrics([]) == {}
