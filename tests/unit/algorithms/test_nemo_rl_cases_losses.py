"""NeMo RL's own unit-test cases for the losses, ported to rlplane (same inputs, same numbers).

Source: NVIDIA-NeMo/RL ``tests/unit/algorithms/test_loss_functions.py`` (and the value-loss and
critic-metric cases of ``test_ppo.py``), commit 7ea279ab. Each test names its source test. NeMo
feeds logits plus ``token_mask = [0, 1, 1, 1]`` and slices ``[:, 1:]``; rlplane takes per-token
logprobs already aligned, so the ports pass NeMo's three unmasked positions directly (the value
NeMo's ``_create_exact_logits`` makes log_softmax return). Written for rlplane; no NeMo code.
"""

from __future__ import annotations

import pytest
import torch

from rlplane.algorithms import ClippedPGOptions, clipped_pg_loss, explained_variance, kl_estimate, nll_loss, value_loss
from rlplane.algorithms._ops import masked_mean
from rlplane.config.algorithms import LossConfig

T = torch.tensor
ADV = [[1.0, -1.0, 2.0]]
PREV = [[-1.0, -1.0, -1.0]]
CURR = [[-1.69315, -1.0, -0.59453]]  # log(0.5) − 1, log(1) − 1, log(1.5) − 1: ratios 0.5, 1, 1.5
GEN = [[-0.5, -1.5, -0.8]]


def pg(curr, adv, prev=None, *, gen=None, ref=None, tm=None, sm=None, grad=False, **opts):
    """clipped_pg_loss with NeMo's test defaults: masks of ones, local global counts, β = 0."""
    curr = torch.as_tensor(curr, dtype=torch.float32).clone().requires_grad_(grad)
    tm = torch.ones_like(curr) if tm is None else torch.as_tensor(tm, dtype=torch.float32)
    sm = torch.ones(curr.shape[0]) if sm is None else torch.as_tensor(sm, dtype=torch.float32)
    opts.setdefault("reference_policy_kl_penalty", 0.0)
    f = lambda x: None if x is None else torch.as_tensor(x, dtype=torch.float32)  # noqa: E731
    loss, metrics = clipped_pg_loss(
        curr_logprobs=curr, advantages=f(adv), prev_logprobs=f(prev), generation_logprobs=f(gen),
        reference_logprobs=f(ref), token_mask=tm, sample_mask=sm,
        global_valid_tokens=(tm * sm[:, None]).sum(), global_valid_seqs=sm.sum(), options=ClippedPGOptions(**opts),
    )
    if grad:
        loss.backward()
        return loss, metrics, curr.grad
    return loss, metrics


def test_nll_loss():
    # test_loss_functions.py::test_nll_loss. input_ids [0, 1, 2, 3], token_mask [0, 0, 1, 1]:
    # after the shift the trained tokens are 2 and 3, predicted from logit rows 1 and 2.
    ids = T([[0, 1, 2, 3]])
    mask = T([[0.0, 0.0, 1.0, 1.0]])[:, 1:]  # (1, 3) aligned with the predicted tokens 1..3

    def logprobs(rows):  # (1, 4, 8) logits -> (1, 3) logprob of the next token
        logits = T(rows).unsqueeze(0)
        return torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)

    right = [[0, 999.0, 0, 0, 0, 0, 0, 0], [0, 0, 999.0, 0, 0, 0, 0, 0], [0, 0, 0, 999.0, 0, 0, 0, 0], [0.0] * 8]
    loss, m = nll_loss(logprobs(right), mask, global_valid_tokens=2)
    torch.testing.assert_close(loss, T(0.0))
    assert m["num_unmasked_tokens"] == 2
    # the wrong token with logit 999 at every step: −log p = 999 per token, mean over 2 tokens
    wrong = [[999.0, 0, 0, 0, 0, 0, 0, 0], [0, 999.0, 0, 0, 0, 0, 0, 0], [0, 0, 999.0, 0, 0, 0, 0, 0], [0.0] * 8]
    loss, m = nll_loss(logprobs(wrong), mask, global_valid_tokens=2)
    torch.testing.assert_close(loss, T(999.0))
    assert m["num_unmasked_tokens"] == 2


def test_clipped_pg_loss_ppo_clipping():
    # test_loss_functions.py::test_clipped_pg_loss_ppo_clipping: r = [0.5, 1, 1.5], r_c = [0.8, 1, 1.2]
    # max(−A·r, −A·r_c) = [−0.5, 1.0, −2.4] -> mean −0.6333
    ratios = torch.exp(T(CURR) - T(PREV))
    expected = torch.maximum(-T(ADV) * ratios, -T(ADV) * ratios.clamp(0.8, 1.2)).mean()
    torch.testing.assert_close(expected, T(-0.6333), rtol=1e-3, atol=0)
    loss, _ = pg(CURR, ADV, PREV)
    torch.testing.assert_close(loss, expected)


def test_clipped_pg_loss_reinforce_mode():
    # test_loss_functions.py::test_clipped_pg_loss_reinforce_mode: −A·log π = [0.5, −1, 3] -> 0.8333
    loss, _ = pg([[-0.5, -1.0, -1.5]], ADV, [[0.0, 0.0, 0.0]], disable_ppo_ratio=True, ratio_clip_min=0.0,
                 ratio_clip_max=0.0)
    torch.testing.assert_close(loss, T(2.5 / 3))


def test_clipped_pg_loss_force_on_policy_ratio():
    # test_loss_functions.py::test_clipped_pg_loss_force_on_policy_ratio: ratio 1 -> mean(−A) = −2/3
    loss, m = pg(CURR, ADV, PREV, force_on_policy_ratio=True)
    torch.testing.assert_close(loss, T(-2.0 / 3.0), rtol=1e-3, atol=1e-3)
    for key in ("probs_ratio", "probs_ratio_clamped", "probs_ratio_min", "probs_ratio_max",
                "probs_ratio_clamped_min", "probs_ratio_clamped_max"):
        assert m[key] == 1.0, key


def test_clipped_pg_loss_force_on_policy_ratio_ignores_prev_logprobs():
    # test_loss_functions.py::test_clipped_pg_loss_force_on_policy_ratio_ignores_prev_logprobs
    curr = [[-1.0, -1.0, -1.0]]
    loss_1, m1 = pg(curr, [[0.0, 0.0, 0.0]], curr, force_on_policy_ratio=True)
    loss_2, m2 = pg(curr, [[0.0, 0.0, 0.0]], [[-10.0, -10.0, -10.0]], force_on_policy_ratio=True)
    torch.testing.assert_close(loss_1, loss_2)
    assert m1["probs_ratio"] == m2["probs_ratio"] == 1.0


@pytest.mark.parametrize("incompatible", [
    {"disable_ppo_ratio": True},
    {"force_on_policy_ratio": True},
    {"ratio_clip_c": 3.0},
    {"sequence_level_importance_ratios": True, "token_level_loss": False},
])
def test_clipped_pg_loss_cispo_incompatibility_asserts(incompatible):
    # test_loss_functions.py::test_clipped_pg_loss_cispo_incompatibility_asserts: rlplane rejects the
    # same combinations, in the config (one line each) and in the kernel
    with pytest.raises(ValueError, match="use_cispo"):
        LossConfig(reference_policy_kl_penalty=0.0, use_cispo=True, **incompatible)
    with pytest.raises(ValueError, match="use_cispo"):
        pg(CURR, ADV, PREV, use_cispo=True, **incompatible)


def test_clipped_pg_loss_cispo():
    # test_loss_functions.py::test_clipped_pg_loss_cispo: −A·sg(clip(r))·log π
    expected = (-T(ADV) * T([[0.8, 1.0, 1.2]]) * T(CURR)).mean()
    loss, _ = pg(CURR, ADV, PREV, use_cispo=True)
    torch.testing.assert_close(loss, expected, rtol=1e-3, atol=1e-3)


def test_clipped_pg_loss_cispo_with_importance_sampling_correction():
    # test_loss_functions.py::test_clipped_pg_loss_cispo_with_importance_sampling_correction:
    # the CISPO term times exp(prev − gen) per token
    w = torch.exp(T(PREV) - T(GEN))
    expected = (w * -T(ADV) * T([[0.8, 1.0, 1.2]]) * T(CURR)).mean()
    loss, _ = pg(CURR, ADV, PREV, gen=GEN, use_cispo=True, use_importance_sampling_correction=True)
    torch.testing.assert_close(loss, expected, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3"])
def test_calculate_kl(kl_type):
    # test_loss_functions.py::test_calculate_kl: lp = −1, ref = [0, −15, −30]; log r = [1, −14, −29]
    lp, ref = T([[-1.0, -1.0, -1.0]]), T([[-0.0, -15.0, -30.0]])
    unclamped = {"k1": [[-1.0, 14.0, 29.0]], "k2": [[0.5, 98.0, 420.5]], "k3": [[0.7183, 13.0, 28.0]]}
    clamped = {"k1": [[-1.0, 10.0, 10.0]], "k2": [[0.5, 10.0, 10.0]], "k3": [[0.7183, 10.0, 10.0]]}
    torch.testing.assert_close(kl_estimate(lp, ref, kl_type, None, None), T(unclamped[kl_type]), rtol=1e-3, atol=0)
    torch.testing.assert_close(kl_estimate(lp, ref, kl_type, 20.0, 10.0), T(clamped[kl_type]), rtol=1e-3, atol=0)


def test_calculate_kl_detaches_importance_sampling_when_input_clamped():
    # test_loss_functions.py::test_calculate_kl_detaches_importance_sampling_when_input_clamped:
    # lp = [−3, −1], ref 0, clamp 2: token 0 clamped (log r = 3 -> 2): k3 = e² − 3 = 4.389, grad 0;
    # token 1: w = exp(lp − sg(lp)), d(w·k3)/dlp = k3 + dk3/dlp = (e − 2) + (1 − e) = −1
    lp = T([[-3.0, -1.0]], requires_grad=True)
    kl = kl_estimate(lp, torch.zeros_like(lp), "k3", 2.0, None, importance_weights=torch.exp(lp - lp.detach()))
    torch.testing.assert_close(kl.detach(), T([[4.389056, 0.7182818]]))
    kl.sum().backward()
    torch.testing.assert_close(lp.grad, T([[0.0, -1.0]]), atol=1e-6, rtol=1e-6)


def test_calculate_kl_output_clamp_includes_importance_sampling_weight():
    # test_loss_functions.py::test_calculate_kl_output_clamp_includes_importance_sampling_weight:
    # 100·k3(1) = 71.8 is clamped to 1 after weighting -> value 1, gradient 0
    lp = T([[-1.0]], requires_grad=True)
    kl = kl_estimate(lp, torch.zeros_like(lp), "k3", None, 1.0, importance_weights=100.0 * torch.exp(lp - lp.detach()))
    torch.testing.assert_close(kl.detach(), T([[1.0]]))
    kl.sum().backward()
    torch.testing.assert_close(lp.grad, torch.zeros_like(lp), atol=1e-6, rtol=1e-6)


def test_clipped_pg_loss_kl_penalty():
    # test_loss_functions.py::test_clipped_pg_loss_kl_penalty: A = 0, log r = ref − curr = [−1, 0, 1]
    # k3 = [0.368, 0, 0.718], mean 0.362, β = 0.1 -> 0.0362
    r = T([[-1.0, 0.0, 1.0]])
    expected = 0.1 * (torch.exp(r) - r - 1).mean()
    torch.testing.assert_close(expected, T(0.0362), rtol=1e-3, atol=0)
    loss, _ = pg([[0.0, -1.0, -2.0]], [[0.0, 0.0, 0.0]], [[0.0, 0.0, 0.0]], ref=[[-1.0, -1.0, -1.0]],
                 reference_policy_kl_penalty=0.1)
    torch.testing.assert_close(loss, expected)


@pytest.mark.parametrize("on_policy", [False, True])
def test_clipped_pg_loss_kl_gradient_includes_sampling_term(on_policy):
    # test_loss_functions.py::test_clipped_pg_loss_kl_gradient_includes_sampling_term:
    # grad(β) − grad(0) = β·w·(k3 + dk3/dcurr)/N, w = exp(curr − gen) (on-policy approx.) or 1
    curr, prev, gen, ref = T([[-1.2, -0.7]]), T([[-1.0, -0.8]]), T([[-1.5, -0.4]]), T([[-0.9, -1.1]])
    adv, beta = [[0.4, -0.2]], 0.3

    def grad(b):
        return pg(curr, adv, prev, gen=gen, ref=ref, grad=True, reference_policy_kl_penalty=b,
                  use_on_policy_kl_approximation=on_policy)[2]

    log_ratio = ref - curr
    kl, dkl = torch.exp(log_ratio) - 1 - log_ratio, 1 - torch.exp(log_ratio)
    w = torch.exp(curr - gen) if on_policy else torch.ones_like(curr)
    torch.testing.assert_close(grad(beta) - grad(0.0), beta * w * (kl + dkl) / curr.numel())


def test_clipped_pg_loss_masking():
    # test_loss_functions.py::test_clipped_pg_loss_masking (random inputs, seeded here):
    # masking one more token changes the loss; sample_mask [1, 0] equals running sample 0 alone
    g = torch.Generator().manual_seed(0)
    curr = torch.log_softmax(torch.randn(2, 3, 8, generator=g), -1)[..., 0]
    prev, ref = torch.randn(2, 3, generator=g) * 0.1, torch.randn(2, 3, generator=g) * 0.1
    adv = torch.randn(2, 3, generator=g) + 1.0
    opts = {"reference_policy_kl_penalty": 0.1}
    default, _ = pg(curr, adv, prev, ref=ref, **opts)
    fewer, _ = pg(curr, adv, prev, ref=ref, tm=[[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]], **opts)
    assert not torch.isclose(default, fewer, atol=1e-4)
    masked, _ = pg(curr, adv, prev, ref=ref, sm=[1.0, 0.0], **opts)
    alone, _ = pg(curr[:1], adv[:1], prev[:1], ref=ref[:1], **opts)
    torch.testing.assert_close(masked, alone)


def test_clipped_pg_loss_zero_mask():
    # test_loss_functions.py::test_clipped_pg_loss_zero_mask: an all-zero token mask gives loss 0
    g = torch.Generator().manual_seed(1)
    loss, _ = pg(-torch.rand(1, 3, generator=g), torch.zeros(1, 3), torch.zeros(1, 3), ref=torch.zeros(1, 3),
                 tm=torch.zeros(1, 3), reference_policy_kl_penalty=0.1)
    torch.testing.assert_close(loss, T(0.0))


def test_clipped_pg_loss_on_policy_kl_importance_sampling():
    # test_loss_functions.py::test_clipped_pg_loss_on_policy_kl_importance_sampling (β = 0 there):
    # w = exp(prev − gen) = [0.6065, 1.6487, 0.8187]; w·max(...) = [−0.30325, 1.6487, −1.96488] -> −0.2065
    loss, _ = pg(CURR, ADV, PREV, gen=GEN, ref=PREV, use_on_policy_kl_approximation=True,
                 use_importance_sampling_correction=True)
    torch.testing.assert_close(loss, T(-0.2065), atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("seq_level", [True, False])
def test_clipped_pg_loss_on_policy_truncated_importance_sampling(seq_level):
    # test_loss_functions.py::test_clipped_pg_loss_on_policy_truncated_importance_sampling, TIS max 0.8:
    # token level: w = [0.6065, 0.8, 0.8] -> [−0.3033, 0.8, −1.92] -> −0.4744
    # GSPO: r = exp(mean log r) = 0.9086, w = exp(Σ(prev − gen)) = exp(−0.2) -> 0.8 -> −0.4846
    opts = {"sequence_level_importance_ratios": True, "token_level_loss": False} if seq_level else {}
    loss, _ = pg(CURR, ADV, PREV, gen=GEN, ref=PREV, use_importance_sampling_correction=True,
                 truncated_importance_sampling_ratio=0.8, truncated_importance_sampling_type="tis", **opts)
    torch.testing.assert_close(loss, T(-0.4846 if seq_level else -0.4744), atol=1e-4, rtol=1e-3)


def test_clipped_pg_loss_icepop_importance_sampling():
    # test_loss_functions.py::test_clipped_pg_loss_icepop_importance_sampling: on-policy, gen stale;
    # w = exp([−0.5, 2.5, −0.2]) = [0.6065, 12.18, 0.8187]; ICE-POP [0.5, 5] zeroes the middle one
    gen = T([[-0.5, -3.5, -0.8]])
    w = torch.exp(T(PREV) - gen)
    expected = (torch.where((w >= 0.5) & (w <= 5.0), w, torch.zeros_like(w)) * -T(ADV)).mean()
    loss, _ = pg(PREV, ADV, PREV, gen=gen, use_importance_sampling_correction=True,
                 truncated_importance_sampling_type="icepop", truncated_importance_sampling_ratio=5.0,
                 truncated_importance_sampling_ratio_min=0.5)
    torch.testing.assert_close(loss, expected, atol=1e-4, rtol=1e-3)


def test_clipped_pg_loss_reports_is_oob_ratio_tis():
    # test_loss_functions.py::test_clipped_pg_loss_reports_is_oob_ratio_tis: w = [1, 3, 0.5], max 2 -> 1/3
    _, m = pg(torch.zeros(1, 3), [[1.0, 1.0, 1.0]], torch.log(T([[1.0, 3.0, 0.5]])), gen=torch.zeros(1, 3),
              use_importance_sampling_correction=True, truncated_importance_sampling_type="tis",
              truncated_importance_sampling_ratio=2.0)
    assert m["is_oob_ratio"].item() == pytest.approx(1.0 / 3.0)


@pytest.mark.parametrize("tis_type", ["tis", "icepop", "seq-mask-tis"])
def test_clipped_pg_loss_rejects_tis_min_above_max(tis_type):
    # test_loss_functions.py::test_clipped_pg_loss_rejects_tis_min_above_max
    opts = {"use_importance_sampling_correction": True, "truncated_importance_sampling_type": tis_type,
            "truncated_importance_sampling_ratio": 1.0, "truncated_importance_sampling_ratio_min": 2.0}
    with pytest.raises(ValueError, match="must not exceed the upper"):
        LossConfig(**opts)
    with pytest.raises(ValueError, match="must not exceed the upper"):
        pg(CURR, ADV, PREV, **opts)


@pytest.mark.parametrize("tis_min, "
                         "weights, oob", [(None, [0.1, 1.0, 2.0], 1.0 / 3.0), (0.5, [0.5, 1.0, 2.0], 2.0 / 3.0)])
def test_clipped_pg_loss_tis_min_bound_defaults_to_zero(tis_min, weights, oob):
    # test_loss_functions.py::test_clipped_pg_loss_tis_min_bound_defaults_to_zero: forced on-policy, so
    # w = exp(curr − gen) = [0.1, 1, 3] -> clamp([min or 0, 2]); loss = −mean(w)
    loss, m = pg(torch.log(T([[0.1, 1.0, 3.0]])), [[1.0, 1.0, 1.0]], None, gen=torch.zeros(1, 3),
                 use_importance_sampling_correction=True, force_on_policy_ratio=True,
                 truncated_importance_sampling_type="tis", truncated_importance_sampling_ratio=2.0,
                 truncated_importance_sampling_ratio_min=tis_min)
    torch.testing.assert_close(loss, -T(weights).mean())
    assert m["is_oob_ratio"].item() == pytest.approx(oob)


def test_clipped_pg_loss_seq_mask_tis():
    # test_loss_functions.py::test_clipped_pg_loss_seq_mask_tis: geo mean exp(0.0005) in [0.999, 1.002]
    # -> kept, loss = mean(w·(−A)); then gen = −inf on one token: the loss stays finite
    gen = T([[-1.0005, -1.0005, -1.0005]])
    opts = {"use_importance_sampling_correction": True, "truncated_importance_sampling_type": "seq-mask-tis",
            "truncated_importance_sampling_ratio": 1.002, "truncated_importance_sampling_ratio_min": 0.999}
    loss, _ = pg(PREV, ADV, PREV, gen=gen, **opts)
    torch.testing.assert_close(loss, (torch.exp(T(PREV) - gen) * -T(ADV)).mean(), atol=1e-4, rtol=1e-3)
    gen[0, 1] = float("-inf")
    loss, _ = pg(PREV, ADV, PREV, gen=gen, **opts)
    assert torch.isfinite(loss)


def test_masked_mean_all_zeros():
    # test_loss_functions.py::test_masked_mean_all_zeros
    v = T([1.0, 2.0, 3.0, 4.0])
    torch.testing.assert_close(masked_mean(v, torch.zeros(4)), T(0.0))
    torch.testing.assert_close(masked_mean(v, T([1.0, 0.0, 0.0, 0.0])), T(1.0))
    torch.testing.assert_close(masked_mean(T([[1.0, 2.0], [3.0, 4.0]]), torch.zeros(2, 2), dim=1), T([0.0, 0.0]))


def test_clipped_pg_loss_dual_clip():
    # test_loss_functions.py::test_clipped_pg_loss_dual_clip: A = [1, −1, −4], r = [0.5, 1, 10], c = 3
    # PPO max = [−0.5, 1, 40]; dual clip where A < 0: min(40, 12) -> [−0.5, 1, 12] -> 12.5/3 = 4.1667
    loss, _ = pg([[-1.69315, -1.0, -0.69741]], [[1.0, -1.0, -4.0]], [[-1.0, -1.0, -3.0]], ratio_clip_c=3.0)
    torch.testing.assert_close(loss, T(4.1667), rtol=1e-3, atol=0)


def test_clipped_pg_loss_entropy():
    # test_loss_functions.py::test_clipped_pg_loss_entropy: −mean(exp(curr − gen)·curr)
    curr, gen = T([[-0.5, -1.0, -1.5]]), T([[-0.6, -1.1, -1.6]])
    _, m = pg(curr, torch.zeros(1, 3), [[-0.4, -0.9, -1.4]], gen=gen)
    torch.testing.assert_close(m["approx_entropy"], -(torch.exp(curr - gen) * curr).mean(), rtol=1e-3, atol=1e-5)


GSPO = {"sequence_level_importance_ratios": True, "token_level_loss": False}


def test_clipped_pg_loss_gspo():
    # test_loss_functions.py::test_clipped_pg_loss_gspo: r = exp(mean log r) = 0.9086 (inside the clip)
    # -A·r = [−0.9086, 0.9086, −1.8171] -> −0.6057
    loss, _ = pg(CURR, ADV, PREV, **GSPO)
    torch.testing.assert_close(loss, T(-0.6057), rtol=1e-3, atol=0)


def test_clipped_pg_loss_gspo_batch_size_2():
    # test_loss_functions.py::test_clipped_pg_loss_gspo_batch_size_2: row 1 has prev −2: r = 2.4697,
    # clipped to 1.2 -> max = [−1.2, 2.4697, −2.4]; mean of 6 tokens = −0.4912
    loss, _ = pg(CURR * 2, ADV * 2, [[-1.0] * 3, [-2.0] * 3], **GSPO)
    torch.testing.assert_close(loss, T(-0.4912), rtol=1e-3, atol=0)


def test_clipped_pg_loss_gspo_importance_sampling_correction():
    # test_loss_functions.py::test_clipped_pg_loss_gspo_importance_sampling_correction:
    # sequence weight exp(Σ(prev − gen)) = exp(−0.2) = 0.8187 -> [−0.7439, 0.7439, −1.4877] -> −0.4959
    loss, _ = pg(CURR, ADV, PREV, gen=GEN, ref=PREV, use_importance_sampling_correction=True, **GSPO)
    torch.testing.assert_close(loss, T(-0.4959), atol=1e-4, rtol=1e-3)


def test_split_rescale_matches_sync_normalization():
    # test_loss_functions.py::test_split_rescale_matches_sync_normalization, adapted: rlplane has no
    # "split" API (raw sums rescaled later); its contract is the "sync" half: micro-batch metrics
    # computed with the global counts and summed equal the metrics of the whole batch at once.
    # Same setting: seq-mask-tis [0.7, 1.5], token-level loss, one dropped sample and tokens.
    g = torch.Generator().manual_seed(1234)
    b, t = 8, 7
    adv, prev, gen, ref = (torch.randn(b, t, generator=g), -torch.rand(b, t, generator=g),
                           -torch.rand(b, t, generator=g), -torch.rand(b, t, generator=g))
    curr = -torch.rand(b, t, generator=g)
    tm = torch.ones(b, t)
    tm[[0, 4], -2:] = 0
    sm = T([1.0, 1, 1, 0, 1, 1, 1, 0])
    opts = {"use_importance_sampling_correction": True, "truncated_importance_sampling_type": "seq-mask-tis",
            "truncated_importance_sampling_ratio": 1.5, "truncated_importance_sampling_ratio_min": 0.7,
            "reference_policy_kl_penalty": 0.01}
    n_tok, n_seq = (tm * sm[:, None]).sum(), sm.sum()

    def run(rows):
        return clipped_pg_loss(curr_logprobs=curr[rows], advantages=adv[rows], prev_logprobs=prev[rows],
                               generation_logprobs=gen[rows], reference_logprobs=ref[rows], token_mask=tm[rows],
                               sample_mask=sm[rows], global_valid_tokens=n_tok, global_valid_seqs=n_seq,
                               options=ClippedPGOptions(**opts))[1]

    whole, halves = run(slice(0, 8)), [run(slice(0, 4)), run(slice(4, 8))]
    from rlplane.algorithms.losses import CLIPPED_PG_METRIC_REDUCTIONS as RED
    for key, value in whole.items():
        combine = {"sum": sum, "min": min, "max": max}[RED[key]]
        torch.testing.assert_close(combine(h[key] for h in halves), value, rtol=1e-5, atol=1e-7, msg=key)


# ---------------------------------------------------------------- value loss (test_ppo.py)


def value_data(seed=0, b=2, t=4):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, t, generator=g).requires_grad_(True), torch.randn(b, t, generator=g),
            torch.randn(b, t, generator=g), torch.ones(b, t))


def test_mse_value_loss_basic():
    # test_ppo.py::test_mse_value_loss_basic: a non-negative scalar with gradient
    v, old, ret, tm = value_data()
    loss, _ = value_loss(v, old, ret, tm, tm.sum())
    assert loss.ndim == 0 and loss.item() >= 0 and loss.requires_grad


def test_mse_value_loss_with_clipping():
    # test_ppo.py::test_mse_value_loss_with_clipping: max(unclipped, clipped) ≥ unclipped
    v, old, ret, tm = value_data()
    clipped, _ = value_loss(v, old, ret, tm, tm.sum(), 0.2)
    plain, _ = value_loss(v, old, ret, tm, tm.sum())
    assert clipped.ndim == 0 and clipped.item() >= plain.item() - 1e-6


def test_mse_value_loss_scale():
    # test_ppo.py::test_mse_value_loss_scale
    v, old, ret, tm = value_data()
    one, _ = value_loss(v, old, ret, tm, tm.sum(), scale=1.0)
    two, _ = value_loss(v, old, ret, tm, tm.sum(), scale=2.0)
    torch.testing.assert_close(two, one * 2.0)


def test_mse_value_loss_masking():
    # test_ppo.py::test_mse_value_loss_masking: values 1, returns 0, sample 1 dropped:
    # 0.5·Σ(1 − 0)²·m / 4 = 0.5 (NeMo asserts > 0; the number is 0.5·MSE)
    v, tm, sm = torch.ones(2, 4, requires_grad=True), torch.ones(2, 4), T([1.0, 0.0])
    loss, _ = value_loss(v, torch.zeros(2, 4), torch.zeros(2, 4), tm, (tm * sm[:, None]).sum(), sample_mask=sm)
    torch.testing.assert_close(loss, T(0.5))


def test_mse_value_loss_perfect_prediction():
    # test_ppo.py::test_mse_value_loss_perfect_prediction
    _, _, ret, tm = value_data()
    loss, _ = value_loss(ret.clone().requires_grad_(True), ret.clone(), ret, tm, 8.0)
    assert loss.item() < 1e-6


def test_mse_value_loss_metrics():
    # test_ppo.py::test_mse_value_loss_metrics
    v, old, ret, tm = value_data()
    _, m = value_loss(v, old, ret, tm, tm.sum(), 0.2, scale=0.4)
    assert {"returns_mean", "values_mean", "values_min", "values_max", "returns_sq_mean",
            "residual_sq_mean", "vf_clipfrac"} <= set(m)


def test_compute_critic_metrics_explained_variance():
    # test_ppo.py::test_compute_critic_metrics_aggregates_and_namespaces_results (the explained-variance
    # part): μ_R = 1, μ_V = 0.5, E[R²] = 5, E[(R − V)²] = 1.25 -> 1 − (1.25 − 0.25)/(5 − 1) = 0.75
    torch.testing.assert_close(explained_variance(1.0, 0.5, 5.0, 1.25), T(0.75, dtype=torch.float64))
    # test_ppo.py::test_compute_critic_metrics_handles_zero_return_variance: 2, 2, 4, 0 -> 1
    torch.testing.assert_close(explained_variance(2.0, 2.0, 4.0, 0.0), T(1.0, dtype=torch.float64))
