"""NeMo RL's own unit-test cases for baselines, advantage estimators and GAE, ported to rlplane.

Sources (NVIDIA-NeMo/RL, commit 7ea279ab): ``tests/unit/algorithms/test_utils.py`` (baseline and
std), ``test_grpo.py`` (GRPO / GDPO / REINFORCE++ estimators, advantage clipping),
``test_advantage_estimator.py`` (OPD), ``test_ppo.py`` (GAE, raw reward, estimator choice). Same
inputs and expected numbers; each test names its source. NeMo's estimators return (B, T)
advantages; rlplane's GRPO-family functions return (B,) (broadcast with ``A[:, None]``), so the
ports compare per sample. Written for rlplane; no NeMo code.
"""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from rlplane.algorithms import (
    KLInReward,
    calculate_baseline_and_std_per_prompt,
    clip_advantages,
    compute_gae,
    gdpo_advantages,
    grpo_advantages,
    length_adaptive_lambda,
    opd_advantages,
    raw_reward_advantages,
    reinforce_plus_plus_advantages,
)
from rlplane.config.algorithms import PPOAdvEstimatorConfig

T = torch.tensor
P2 = T([[1, 2, 3]] * 3 + [[4, 5, 6]] * 3)  # two prompts of three generations


def close(a, b, rtol=1e-5, atol=1e-6):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               rtol=rtol, atol=atol)


# ---------------------------------------------------------------- test_utils.py: baseline and std


def test_calculate_baseline_and_std_per_prompt_basic():
    # test_utils.py::test_calculate_baseline_and_std_per_prompt_basic: LOO, [1, 2, 3] | [4, 5, 6]
    b, s = calculate_baseline_and_std_per_prompt(P2, T([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), torch.ones(6))
    close(b, [2.5, 2.0, 1.5, 5.5, 5.0, 4.5])
    close(s, [0.707107, 1.414214, 0.707107, 0.707107, 1.414214, 0.707107])


def test_calculate_baseline_and_std_per_prompt_single_generation_per_prompt():
    # test_utils.py::test_calculate_baseline_and_std_per_prompt_single_generation_per_prompt
    b, s = calculate_baseline_and_std_per_prompt(T([[1, 2, 3], [4, 5, 6]]), T([2.5, 4.0]), torch.ones(2))
    close(b, [2.5, 4.0])
    close(s, [0.0, 0.0])


def test_calculate_baseline_and_std_per_prompt_identical_rewards():
    # test_utils.py::test_calculate_baseline_and_std_per_prompt_identical_rewards
    b, s = calculate_baseline_and_std_per_prompt(P2, T([3.0, 3.0, 3.0, 7.0, 7.0, 7.0]), torch.ones(6))
    close(b, [3.0, 3.0, 3.0, 7.0, 7.0, 7.0])
    assert (s == 0).all()  # exactly 0 (NeMo's test: ≈ 0)


def test_calculate_baseline_and_std_per_prompt_mixed_prompt_sizes():
    # test_utils.py::test_calculate_baseline_and_std_per_prompt_mixed_prompt_sizes
    p = T([[1, 2, 3]] * 2 + [[4, 5, 6]] * 3)
    b, s = calculate_baseline_and_std_per_prompt(p, T([1.0, 2.0, 4.0, 5.0, 6.0]), torch.ones(5))
    close(b, [2.0, 1.0, 5.5, 5.0, 4.5])
    close(s, [0.0, 0.0, 0.707107, 1.414214, 0.707107])


def test_calculate_baseline_and_std_per_prompt_empty_input():
    # test_utils.py::test_calculate_baseline_and_std_per_prompt_empty_input
    b, s = calculate_baseline_and_std_per_prompt(torch.empty(0, 3, dtype=torch.long), T([]), T([]))
    assert b.shape == s.shape == torch.Size([0])


def test_calculate_baseline_and_std_per_prompt_nan_handling():
    # test_utils.py::test_calculate_baseline_and_std_per_prompt_nan_handling: sample 1 invalid (999)
    # valid samples: NeMo's numbers exactly. The invalid sample itself: NeMo gives baseline
    # (1 + 3)/(2 − 1) = 4 and std 0 (it divides by n_valid − 1 for every row); rlplane gives it the
    # mean and std of the valid samples, 2 and sqrt(2) (docs/algorithms.md, differences table:
    # its advantage is never trained on, and NeMo always passes an all-ones mask).
    r = T([1.0, 999.0, 3.0, 4.0, 5.0, 6.0])
    b, s = calculate_baseline_and_std_per_prompt(P2, r, T([1.0, 0.0, 1.0, 1.0, 1.0, 1.0]))
    keep = [0, 2, 3, 4, 5]
    close(b[keep], [3.0, 1.0, 5.5, 5.0, 4.5])
    close(s[keep], [0.0, 0.0, 0.707107, 1.414214, 0.707107])
    close([b[1], s[1]], [2.0, math.sqrt(2.0)])


def test_calculate_baseline_and_std_per_prompt_cuda_compatibility():
    # test_utils.py::test_calculate_baseline_and_std_per_prompt_cuda_compatibility: the numbers on
    # CPU always, and on the GPU's device when there is one
    device = "cuda" if torch.cuda.is_available() else "cpu"
    p = T([[1, 2, 3], [1, 2, 3], [4, 5, 6], [4, 5, 6]], device=device)
    b, s = calculate_baseline_and_std_per_prompt(p, T([1.0, 2.0, 3.0, 4.0], device=device),
                                                 torch.ones(4, device=device))
    assert b.device.type == s.device.type == device
    close(b.cpu(), [2.0, 1.0, 4.0, 3.0])
    close(s.cpu(), [0.0, 0.0, 0.0, 0.0])


def test_calculate_baseline_and_std_per_prompt_numerical_precision():
    # test_utils.py::test_calculate_baseline_and_std_per_prompt_numerical_precision
    b, s = calculate_baseline_and_std_per_prompt(P2, T([1e-8, 2e-8, 3e-8, 1e8, 2e8, 3e8]), torch.ones(6))
    close(b, [2.5e-8, 2e-8, 1.5e-8, 2.5e8, 2e8, 1.5e8], atol=0)
    assert torch.isfinite(s).all()


# ---------------------------------------------------------------- test_grpo.py: estimators


def grpo_whole_group(prompt_ids, rewards):
    """NeMo's tests build the estimator with use_leave_one_out_baseline=False, normalize_rewards=True."""
    return grpo_advantages(prompt_ids, rewards, use_leave_one_out_baseline=False)


def test_grpo_advantage_estimator_zero_std():
    # test_grpo.py::test_grpo_advantage_estimator_zero_std: [2, 2] -> 0; [1, 3]: std sqrt(2) -> ∓1/sqrt(2)
    a = grpo_whole_group(T([[0], [0], [1], [1]]), T([2.0, 2.0, 1.0, 3.0]))
    close(a, [0.0, 0.0, -1 / math.sqrt(2), 1 / math.sqrt(2)], rtol=1e-4)


def test_grpo_advantage_estimator_tensor_shapes():
    # test_grpo.py::test_grpo_advantage_estimator_tensor_shapes
    a = grpo_whole_group(T([[0], [0]]), T([1.0, 3.0]))
    close(a[:, None].expand(2, 3), T([[-1.0], [1.0]]).expand(2, 3) / math.sqrt(2), rtol=1e-4)
    a = grpo_whole_group(T([[0]] * 10), torch.arange(10, dtype=torch.float32))
    assert a.shape == (10,) and a.mean().abs() < 1e-5


def test_grpo_advantage_estimator_negative_advantages():
    # test_grpo.py::test_grpo_advantage_estimator_negative_advantages: [0, 2, 4]
    a = grpo_whole_group(T([[0], [0], [0]]), T([0.0, 2.0, 4.0]))
    assert a[0] < 0 and a[1].abs() < 1e-5 and a[2] > 0
    close(a[0], -a[2])


def test_grpo_advantage_estimator_zero_std_and_zero_advantage():
    # test_grpo.py::test_grpo_advantage_estimator_zero_std_and_zero_advantage
    assert (grpo_whole_group(T([[0]] * 4), T([5.0] * 4)) == 0).all()


def test_grpo_advantage_estimator_small_nonzero_std():
    # test_grpo.py::test_grpo_advantage_estimator_small_nonzero_std: [1, 1.01] still normalised to ±1/sqrt(2)
    a = grpo_whole_group(T([[0], [0]]), T([1.0, 1.01]))
    close(a.abs(), [1 / math.sqrt(2)] * 2, rtol=1e-3)
    assert a[0] * a[1] < 0


def test_gdpo_advantage_estimator_multiple_rewards():
    # test_grpo.py::test_gdpo_advantage_estimator_multiple_rewards: correctness [1, 1] -> 0,
    # integer [1, −1] -> ±1/sqrt(2)·(…), format [1, 0]; summed, batch-whitened -> ±0.7071
    comps = {"correctness": T([1.0, 1.0]), "integer": T([1.0, -1.0]), "format": T([1.0, 0.0])}
    a = gdpo_advantages(T([[0], [0]]), comps, use_leave_one_out_baseline=False)
    close(a, [0.7071, -0.7071], rtol=1e-4, atol=1e-4)


def test_gdpo_advantage_estimator_single_reward():
    # test_grpo.py::test_gdpo_advantage_estimator_single_reward
    with pytest.raises(ValueError, match="at least 2"):
        gdpo_advantages(T([[0], [0]]), {"correctness": T([1.0, 3.0])}, use_leave_one_out_baseline=False)


def test_gdpo_advantage_estimator_reward_weights():
    # test_grpo.py::test_gdpo_advantage_estimator_reward_weights
    comps = {"correctness": T([1.0, 0.0, 1.0]), "format": T([1.0, 1.0, 0.0])}

    def run(w):
        return gdpo_advantages(T([[0]] * 3), comps, reward_weights=w, use_leave_one_out_baseline=False)

    default = run(None)
    close(default, run([2.0, 2.0]), atol=1e-5)  # uniform scaling is removed by the batch whitening
    assert not torch.allclose(default, run([1.0, 0.25]), atol=1e-3)
    with pytest.raises(ValueError, match="reward_weights"):
        run([1.0])


def test_reinforce_plus_plus_global_normalization():
    # test_grpo.py::test_reinforce_plus_plus_global_normalization: [0, 1, 2, 3], one group, 5 tokens each
    mask = torch.ones(4, 5)
    a = reinforce_plus_plus_advantages(T([[0]] * 4), T([0.0, 1.0, 2.0, 3.0]), mask)
    assert ((a * mask).sum() / mask.sum()).abs() < 1e-5
    assert a[0, 0] < a[1, 0] < a[2, 0] < a[3, 0]


def test_clip_grpo_advantages_respects_config_bounds():
    # test_grpo.py::test_clip_grpo_advantages_respects_config_bounds
    a = T([[-10.0, 15.0], [0.0, 5.0]])
    clipped = clip_advantages(a.clone(), -2.0, 3.0)
    assert clipped.min().item() == -2.0 and clipped.max().item() == 3.0
    assert torch.equal(clip_advantages(a.clone(), None, None), a)


# ---------------------------------------------------------------- test_advantage_estimator.py: OPD


def test_opd_basic_positive_distill_advantage():
    # test_advantage_estimator.py::test_opd_basic_positive_distill_advantage
    a = opd_advantages(torch.zeros(2, 4), torch.full((2, 4), -1.0), torch.ones(2, 4))
    assert a.shape == (2, 4) and (a > 0).all()


def test_opd_teacher_equals_student():
    # test_advantage_estimator.py::test_opd_teacher_equals_student
    lp = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(opd_advantages(lp, lp, torch.ones(2, 4)), torch.zeros(2, 4))


def test_opd_mask_applied():
    # test_advantage_estimator.py::test_opd_mask_applied
    a = opd_advantages(torch.zeros(1, 6), torch.full((1, 6), -1.0), T([[1.0, 1, 1, 0, 0, 0]]))
    assert (a[:, 3:] == 0).all() and (a[:, :3] > 0).all()


def test_opd_metrics_values():
    # test_advantage_estimator.py::test_opd_metrics_returned: NeMo logs the teacher−student gap mean
    # 1.0, adv mean 1.0, adv std 0 from its estimator; rlplane's opd_advantages returns only the
    # advantages (no metrics; see docs/algorithms.md), so the port checks the same three numbers on them
    a = opd_advantages(torch.zeros(2, 4), torch.full((2, 4), -1.0), torch.ones(2, 4))
    close([a.mean(), a.std()], [1.0, 0.0])


# ---------------------------------------------------------------- test_ppo.py: GAE, raw reward


def gae(rewards, values, mask, **kw):
    kw.setdefault("normalize_advantages", False)  # NeMo's _make_gae_config default
    return compute_gae(T(rewards), T(values), T(mask), **kw)


def test_gae_basic_computation():
    # test_ppo.py::test_gae_basic_computation: γ = λ = 1 -> A_t = R − V_t; returns = A + V
    adv, ret = gae([1.0], [[0.5] * 4], [[1.0] * 4], gae_lambda=1.0, gae_gamma=1.0)
    assert adv.shape == ret.shape == (1, 4)
    close(ret, adv + 0.5)
    close(adv, [[0.5] * 4])  # 1 − 0.5 at every token (NeMo checks only returns = A + V)


def test_gae_gamma_lambda_zero():
    # test_ppo.py::test_gae_gamma_lambda_zero: λ = 0 -> δ_t: [0 + 2 − 1, 0 + 3 − 2, 5 + 0 − 3] = [1, 1, 2]
    adv, _ = gae([5.0], [[1.0, 2.0, 3.0]], [[1.0] * 3], gae_lambda=0.0, gae_gamma=1.0)
    close(adv, [[1.0, 1.0, 2.0]])


def test_gae_shape_and_masking():
    # test_ppo.py::test_gae_shape_and_masking
    mask = torch.ones(3, 5)
    mask[1, 3:], mask[2, 4:] = 0, 0
    values = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    adv, ret = compute_gae(T([1.0, 2.0, 3.0]), values, mask, gae_lambda=0.95, gae_gamma=1.0, normalize_advantages=False)
    assert adv.shape == ret.shape == (3, 5)
    assert adv[1, 3:].abs().sum() == 0 and adv[2, 4:].abs().sum() == 0


def test_gae_normalize_advantages():
    # test_ppo.py::test_gae_normalize_advantages
    g = torch.Generator().manual_seed(0)
    adv, _ = compute_gae(torch.randn(8, generator=g) * 5, torch.randn(8, 10, generator=g), torch.ones(8, 10),
                         gae_lambda=0.95, gae_gamma=1.0, normalize_advantages=True)
    assert adv.mean().abs() < 0.1 and (adv.std() - 1.0).abs() < 0.2


def test_gae_kl_penalty_in_rewards():
    # test_ppo.py::test_gae_kl_penalty_in_rewards (β = 0.1, k1). rlplane passes β only when
    # loss_fn.use_kl_in_reward is on (PPOAdvEstimatorConfig.gae_kwargs), so the "gated off" case is β = 0.
    lp, same, far = T([[-1.0, -2.0, -1.5]]), T([[-1.0, -2.0, -1.5]]), T([[-3.0, -4.0, -3.5]])
    kw = {"gae_lambda": 1.0, "gae_gamma": 1.0, "normalize_advantages": False}
    beta_01, beta_0 = KLInReward(0.1, "k1"), KLInReward(0.0, "k1")
    no_kl, _ = compute_gae(T([1.0]), torch.zeros(1, 3), torch.ones(1, 3), **kw)
    zero, _ = compute_gae(T([1.0]), torch.zeros(1, 3), torch.ones(1, 3), kl_in_reward=beta_01, prev_logprobs=lp,
                          reference_logprobs=same, **kw)
    torch.testing.assert_close(zero, no_kl)
    pos, _ = compute_gae(T([1.0]), torch.zeros(1, 3), torch.ones(1, 3), kl_in_reward=beta_01, prev_logprobs=lp,
                         reference_logprobs=far, **kw)
    assert not torch.allclose(pos, no_kl)
    # k1 = lp − ref = 2 per token, −β·2 = −0.2 each; γ = λ = 1: A_0 = 1 − 0.6, A_1 = 1 − 0.4, A_2 = 1 − 0.2
    close(pos, [[0.4, 0.6, 0.8]])
    off, _ = compute_gae(T([1.0]), torch.zeros(1, 3), torch.ones(1, 3), kl_in_reward=beta_0, prev_logprobs=lp,
                         reference_logprobs=far, **kw)
    torch.testing.assert_close(off, no_kl)


def test_gae_vapo_decoupled_lambda():
    # test_ppo.py::test_gae_vapo_decoupled_lambda: λ_value 1, λ_policy 0.5 -> returns ≠ A + V
    values = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
    adv, ret = compute_gae(T([1.0, 2.0]), values, torch.ones(2, 4), gae_lambda=0.95, gae_gamma=1.0,
                           gae_lambda_value=1.0, gae_lambda_policy=0.5, normalize_advantages=False)
    assert adv.shape == ret.shape == (2, 4)
    assert not torch.allclose(ret, adv + values, atol=1e-5)


def test_gae_length_adaptive_lambda():
    # test_ppo.py::test_gae_length_adaptive_lambda: α = 0.05, L = 3 and 8: 1 − 1/(αL) < 0 -> 0
    mask = torch.zeros(2, 10)
    mask[0, :3], mask[1, :8] = 1, 1
    lam = length_adaptive_lambda(mask, 0.05)
    assert lam.shape == (2,) and ((lam >= 0) & (lam <= 1)).all()
    close(lam, [0.0, 0.0])


def test_gae_carry_forward_interior_gap():
    # test_ppo.py::test_gae_carry_forward_interior_gap: a masked interior token (value 999) is skipped
    kw = {"gae_lambda": 0.95, "gae_gamma": 0.99}
    gap, _ = gae([1.0], [[0.1, 0.2, 999.0, 0.4, 0.5]], [[1.0, 1.0, 0.0, 1.0, 1.0]], **kw)
    flat, _ = gae([1.0], [[0.1, 0.2, 0.4, 0.5]], [[1.0] * 4], **kw)
    torch.testing.assert_close(gap[0, [0, 1, 3, 4]], flat[0])
    assert gap[0, 2] == 0


def test_raw_reward_basic_broadcast_and_masking():
    # test_ppo.py::test_raw_reward_basic_broadcast_and_masking: r = [2, −1] on every token. NeMo also
    # writes r on the padding; rlplane writes 0 there (differences table: padding never reaches a loss).
    mask = T([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    a = raw_reward_advantages(T([2.0, -1.0]), mask, normalize_advantages=False)
    torch.testing.assert_close(a[mask.bool()], T([2.0, 2.0, 2.0, -1.0, -1.0]))
    assert (a[~mask.bool()] == 0).all()


def test_create_advantage_estimator_choices():
    # test_ppo.py::test_create_advantage_estimator_gae / _raw_reward / _uses_ppo_config_default /
    # _rejects_unsupported_name: the PPO config takes gae (default) or raw_reward, refuses grpo
    assert PPOAdvEstimatorConfig().name == "gae"
    assert PPOAdvEstimatorConfig(name="raw_reward", normalize_advantages=True).name == "raw_reward"
    with pytest.raises(ValidationError):
        PPOAdvEstimatorConfig(name="grpo")
