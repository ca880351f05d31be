"""Hand-computed tests for the clipped PG loss (every option), its metrics, NLL and value losses."""

from __future__ import annotations

import math

import pytest
import torch

from rlplane.algorithms import ClippedPGOptions, clipped_pg_loss, explained_variance, kl_estimate, nll_loss, value_loss
from rlplane.algorithms.losses import CLIPPED_PG_METRIC_REDUCTIONS

L = math.log
LN2 = math.log(2.0)


def close(a, b, tol=1e-5):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               atol=tol, rtol=tol)


def pg(curr, adv, *, prev=None, gen=None, ref=None, tm=None, sm=None, n_tok=None, n_seq=None, **opts):
    """Call clipped_pg_loss with β = 0 unless given, masks of ones and local counts by default."""
    curr = torch.as_tensor(curr, dtype=torch.float64).requires_grad_(True)
    tm = torch.ones_like(curr) if tm is None else torch.as_tensor(tm, dtype=torch.float64)
    sm = torch.ones(curr.shape[0], dtype=torch.float64) if sm is None else torch.as_tensor(sm, dtype=torch.float64)
    opts.setdefault("reference_policy_kl_penalty", 0.0)
    t = lambda x: None if x is None else torch.as_tensor(x, dtype=torch.float64)  # noqa: E731
    tensors = {k: opts.pop(k) for k in ("rewards", "curr_logprobs_unfiltered",
                                        "global_valid_positive_tokens") if k in opts}
    loss, metrics = clipped_pg_loss(
        curr_logprobs=curr, prev_logprobs=t(prev) if prev is not None else torch.zeros_like(curr),
        generation_logprobs=t(gen),
        reference_logprobs=t(ref), advantages=torch.as_tensor(adv, dtype=torch.float64), token_mask=tm, sample_mask=sm,
        global_valid_tokens=(tm * sm[:, None]).sum() if n_tok is None else n_tok,
        global_valid_seqs=sm.sum() if n_seq is None else n_seq, **tensors, options=ClippedPGOptions(**opts),
    )
    loss.backward()
    return loss.detach(), metrics, curr.grad


# ratios r = exp(curr − prev) with prev = 0: [[1.5, 0.5], [1.1, 0.9]]
CURR = [[L(1.5), L(0.5)], [L(1.1), L(0.9)]]
ADV = [[1.0, -1.0], [-1.0, 1.0]]


def test_ppo_clip_loss_gradient_and_ratio_metrics():
    # (0,0) r=1.5, A=+1: max(−1.5, −1.2) = −1.2   (clipped high, no gradient)
    # (0,1) r=0.5, A=−1: max(0.5, 0.8) = 0.8       (clipped low, no gradient)
    # (1,0) r=1.1, A=−1: 1.1 ; (1,1) r=0.9, A=+1: −0.9
    # loss = (−1.2 + 0.8 + 1.1 − 0.9)/4 = −0.05; dL/dcurr = −A·r/4 on unclipped tokens
    loss, m, grad = pg(CURR, ADV)
    close(loss, -0.05)
    close(grad, [[0.0, 0.0], [1.1 / 4, -0.9 / 4]])
    close(m["loss"], -0.05)
    close(m["probs_ratio"], (1.5 + 0.5 + 1.1 + 0.9) / 4)
    close(m["probs_ratio_clamped"], (1.2 + 0.8 + 1.1 + 0.9) / 4)
    close([m["probs_ratio_min"], m["probs_ratio_max"]], [0.5, 1.5])
    close([m["probs_ratio_clamped_min"], m["probs_ratio_clamped_max"]], [0.8, 1.2])
    close([m["clip_fraction_low"], m["clip_fraction_high"], m["clip_fraction"]], [0.25, 0.25, 0.5])
    close(m["num_valid_samples"], 2.0)
    close(m["kl_penalty"], 0.0)
    # gen = prev: no mismatch
    close([m["token_mult_prob_error"], m["gen_kl_error"], m["policy_kl_error"], m["js_divergence_error"]],
          [1.0, 0.0, 0.0, 0.0])
    close(m["sampling_importance_ratio"], 1.0)
    assert set(m) <= set(CLIPPED_PG_METRIC_REDUCTIONS)
    assert all(not v.requires_grad for v in m.values())


def test_asymmetric_clip_higher():
    # ε_low = 0.2, ε_high = 0.28: (0,0) r=1.5 -> r_c = 1.28 -> −1.28; sum = −1.28 + 0.8 + 1.1 − 0.9 = −0.28
    loss, m, _ = pg(CURR, ADV, ratio_clip_max=0.28)
    close(loss, -0.28 / 4)
    close(m["probs_ratio_clamped_max"], 1.28)


def test_dual_clip_bounds_negative_advantage_loss():
    # r = 4, A = −1: max(4, 1.2) = 4, dual clip c = 3: min(4, 3) = 3, gradient 0
    # r = 2, A = −1: max(2, 1.2) = 2 < 3: unchanged, dL/dcurr = −A·r = 2
    loss, m, grad = pg([[L(4.0), L(2.0)]], [[-1.0, -1.0]], ratio_clip_c=3.0)
    close(loss, (3 + 2) / 2)
    close(grad, [[0.0, 2.0 / 2]])
    close(m["dual_clip_fraction"], 0.5)


def test_disable_ppo_ratio_is_reinforce():
    # loss = mean(−A·log π) = (−1·(−1) − 2·(−2))/2 = (1 + 4)/2 = 2.5, grad = −A/N
    loss, m, grad = pg([[-1.0, -2.0]], [[1.0, 2.0]], disable_ppo_ratio=True)
    close(loss, 2.5)
    close(grad, [[-0.5, -1.0]])
    close(m["probs_ratio"], -1.5)  # the "ratio" is log π itself in this mode (NeMo RL)
    close(m["clip_fraction"], 0.0)


def test_force_on_policy_ratio_is_one_with_gradient():
    # r = exp(curr − sg(curr)) = 1 -> loss = mean(−A) = −(1 + 3)/2 = −2; dL/dcurr = −A·1/N
    curr = torch.tensor([[-0.7, -1.3]], dtype=torch.float64, requires_grad=True)
    loss, m = clipped_pg_loss(
        curr_logprobs=curr, advantages=torch.tensor([[1.0, 3.0]], dtype=torch.float64), token_mask=torch.ones(1, 2),
        sample_mask=torch.ones(1), global_valid_tokens=2, global_valid_seqs=1,
        options=ClippedPGOptions(reference_policy_kl_penalty=0.0, force_on_policy_ratio=True),
    )
    loss.backward()
    close(loss, -2.0)
    close(curr.grad, [[-0.5, -1.5]])
    close(m["probs_ratio"], 1.0)


def test_gspo_sequence_level_ratio():
    # log ratios [ln 2, 0] -> sequence ratio exp(ln2/2) = sqrt 2 ≈ 1.414 on both tokens; A = 1 -> r_c = 1.2
    # per token max(−1.414, −1.2) = −1.2; sequence mean −1.2; 1 sequence -> loss −1.2 (no gradient: clipped)
    loss, m, grad = pg([[LN2, 0.0]], [1.0], token_level_loss=False, sequence_level_importance_ratios=True)
    close(loss, -1.2)
    close(grad, [[0.0, 0.0]])
    close(m["probs_ratio"], math.sqrt(2))
    # unclipped (A = −1): per token max(1.414, 1.2) = sqrt2 -> loss sqrt2;
    # d/dcurr_t of exp(mean(curr)) = sqrt2 · 1/2 (mean over 2 tokens)
    loss, _, grad = pg([[LN2, 0.0]], [-1.0], token_level_loss=False, sequence_level_importance_ratios=True)
    close(loss, math.sqrt(2))
    close(grad, [[math.sqrt(2) / 2, math.sqrt(2) / 2]])


def test_sequence_level_loss_mean_of_sequence_means():
    # token-level surrogates (r = 1): −A; row 0 A = [1, 3] (2 tokens) -> mean −2; row 1 A = [4, x(masked)] -> −4
    # sequence loss = (−2 − 4)/2 = −3; token loss would be (−1 − 3 − 4)/3 = −8/3
    tm = [[1.0, 1.0], [1.0, 0.0]]
    adv = [[1.0, 3.0], [4.0, 100.0]]
    loss, _, _ = pg(torch.zeros(2, 2), adv, tm=tm, token_level_loss=False)
    close(loss, -3.0)
    loss, _, _ = pg(torch.zeros(2, 2), adv, tm=tm)
    close(loss, -8 / 3)


def test_cispo_keeps_gradient_on_clipped_tokens():
    # CISPO: −A·sg(clamp(r))·log π; r = 1.5 -> r_c = 1.2; A = 1: loss = −1.2·ln 1.5, grad = −1.2
    loss, m, grad = pg([[L(1.5)]], [1.0], use_cispo=True)
    close(loss, -1.2 * L(1.5))
    close(grad, [[-1.2]])
    close(m["clip_fraction_high"], 1.0)


def test_importance_sampling_correction_and_truncation():
    # prev = 0, gen = ln 0.5 -> w = exp(0 − ln 0.5) = 2; curr = 0, A = 1 -> surrogate −1
    kw = dict(prev=[[0.0]], gen=[[L(0.5)]])
    loss, m, _ = pg([[0.0]], [1.0], **kw)
    close(loss, -1.0)  # no IS correction: weight 1, but the metric still shows w
    close(m["sampling_importance_ratio"], 2.0)
    loss, m, grad = pg([[0.0]], [1.0], use_importance_sampling_correction=True, **kw)
    close(loss, -2.0)
    close(grad, [[-2.0]])  # w is not differentiated
    # tis: clamp w to [0, 1.5] -> −1.5, is_oob_ratio 1
    loss, m, _ = pg([[0.0]], [1.0], use_importance_sampling_correction=True, truncated_importance_sampling_type="tis",
                    truncated_importance_sampling_ratio=1.5, **kw)
    close(loss, -1.5)
    close([m["is_oob_ratio"], m["sampling_importance_ratio"]], [1.0, 1.5])
    # icepop [0.5, 1.5]: w = 2 is out -> weight 0 -> loss 0
    loss, m, _ = pg([[0.0]], [1.0], use_importance_sampling_correction=True,
                    truncated_importance_sampling_type="icepop",
                    truncated_importance_sampling_ratio=1.5, truncated_importance_sampling_ratio_min=0.5, **kw)
    close(loss, 0.0)
    close(m["is_oob_ratio"], 1.0)


def test_seq_mask_tis_drops_whole_sequences():
    # row 0: prev − gen = [0.1, −0.1] -> geometric mean exp(0) = 1 (kept); token weights exp(±0.1)
    # row 1: prev − gen = [ln 2, ln 2] -> geometric mean 2 > 1.5 (dropped)
    # A = 1, curr = prev = 0 -> surrogate −1: loss = (−e^0.1 − e^−0.1 + 0 + 0)/4
    gen = [[-0.1, 0.1], [-LN2, -LN2]]
    loss, m, _ = pg(torch.zeros(2, 2), [1.0, 1.0], gen=gen, use_importance_sampling_correction=True,
                    truncated_importance_sampling_type="seq-mask-tis", truncated_importance_sampling_ratio=1.5,
                    truncated_importance_sampling_ratio_min=0.5)
    close(loss, -(math.exp(0.1) + math.exp(-0.1)) / 4)
    close(m["is_oob_ratio"], 0.5)  # 1 of 2 sequences, sequence-normalised


def test_sequence_level_is_weight_and_metric():
    # GSPO IS weight per sequence: exp(Σ_t (prev − gen)) = exp(0.2 + 0.3) = e^0.5; sequence-normalised metric
    _, m, _ = pg(torch.zeros(1, 2), [1.0], gen=[[-0.2, -0.3]], token_level_loss=False,
                 sequence_level_importance_ratios=True)
    close(m["sampling_importance_ratio"], math.exp(0.5))


@pytest.mark.parametrize(
    "kl_type, expected",
    [
        # log r = ref − curr = ln 0.5 = −0.6931
        ("k1", LN2),  # −log r
        ("k2", 0.5 * LN2**2),  # (log r)²/2 = 0.2402
        ("k3", 0.5 - 1 + LN2),  # r − 1 − log r = 0.1931
    ],
)
def test_reference_kl_types(kl_type, expected):
    loss, m, _ = pg([[0.0]], [0.0], ref=[[L(0.5)]], reference_policy_kl_penalty=0.1, reference_policy_kl_type=kl_type)
    close(loss, 0.1 * expected)
    close(m["kl_penalty"], expected)


def test_reference_kl_gradient_includes_score_function_term():
    # kl_w = exp(curr − sg(curr)) = 1 with gradient: d/dcurr [w·k3] = k3 + dk3/dcurr
    # k3 = 0.1931; dk3/dcurr = 1 − exp(ref − curr) = 1 − 0.5 = 0.5 -> β·(0.1931 + 0.5) = 0.1·0.6931
    _, _, grad = pg([[0.0]], [0.0], ref=[[L(0.5)]], reference_policy_kl_penalty=0.1)
    close(grad, [[0.1 * (0.5 - 1 + LN2 + 0.5)]])


def test_reference_kl_clamps_and_on_policy_approximation():
    # input clamp 0.5: log r = −0.693 -> −0.5; k3 = e^−0.5 − 1 + 0.5 = 0.10653
    _, m, _ = pg([[0.0]], [0.0], ref=[[L(0.5)]], reference_policy_kl_penalty=1.0, kl_input_clamp_value=0.5)
    close(m["kl_penalty"], math.exp(-0.5) - 0.5)
    # output clamp 0.1 on k1 = 0.693 -> 0.1
    _, m, _ = pg([[0.0]], [0.0], ref=[[L(0.5)]], reference_policy_kl_penalty=1.0, reference_policy_kl_type="k1",
                 kl_output_clamp_value=0.1)
    close(m["kl_penalty"], 0.1)
    # on-policy approximation: w = exp(curr − gen) = exp(0 − ln 0.5) = 2 -> 2·k3
    _, m, _ = pg([[0.0]], [0.0], ref=[[L(0.5)]], gen=[[L(0.5)]], reference_policy_kl_penalty=1.0,
                 use_on_policy_kl_approximation=True)
    close(m["kl_penalty"], 2 * (0.5 - 1 + LN2))


def test_kl_in_reward_forces_loss_beta_to_zero():
    loss, m, _ = pg([[0.0]], [0.0], ref=[[L(0.5)]], reference_policy_kl_penalty=0.1, use_kl_in_reward=True)
    close(loss, 0.0)
    close(m["kl_penalty"], 0.0)


def test_kl_uses_unfiltered_logprobs_when_given():
    curr = torch.zeros(1, 1, dtype=torch.float64, requires_grad=True)
    _, m = clipped_pg_loss(
        curr_logprobs=curr, prev_logprobs=torch.zeros(1, 1), reference_logprobs=torch.full((1, 1), L(0.5)),
        curr_logprobs_unfiltered=torch.full((1, 1), L(0.5)), advantages=torch.zeros(1), token_mask=torch.ones(1, 1),
        sample_mask=torch.ones(1), global_valid_tokens=1, global_valid_seqs=1,
        options=ClippedPGOptions(reference_policy_kl_penalty=1.0),
    )
    close(m["kl_penalty"], 0.0)  # unfiltered curr equals ref -> k3 = 0


def test_positive_example_nll():
    # μ = 0.5, rewards [1, 0]: NLL over row 0's tokens only = −(−1 − 3)/2 = 2 -> + 0.5·2; A = 0
    loss, m, _ = pg([[-1.0, -3.0], [-5.0, -5.0]], [0.0, 0.0], prev=[[-1.0, -3.0], [-5.0, -5.0]],
                    positive_example_nll_weight=0.5, rewards=torch.tensor([1.0, 0.0]))
    close(m["positive_nll_loss"], 2.0)
    close(loss, 1.0)


def test_mismatch_metrics_hand_computed():
    # prev = 0 (p = 1), gen = ln 0.5 (p = 0.5):
    # token_mult_prob_error = exp(|ln 0.5|) = 2
    # gen_kl_error (k3, samples from gen, log r = prev − gen = ln 2): 2 − 1 − ln 2 = 0.3069
    # policy_kl_error (log r = gen − prev = −ln 2): 0.5 − 1 + ln 2 = 0.1931
    # JS: M = 0.75; KL(train‖M) term = 1/0.75 − 1 − ln(1/0.75) = 0.04565; gen term = 0.5/0.75 − 1 − ln(2/3) = 0.07213
    # approx_entropy = −exp(curr − gen)·curr with curr = ln 0.25: −(0.25/0.5)·ln 0.25 = 0.6931
    _, m, _ = pg([[L(0.25)]], [0.0], prev=[[0.0]], gen=[[L(0.5)]])
    close(m["token_mult_prob_error"], 2.0)
    close(m["gen_kl_error"], 1 - LN2)
    close(m["policy_kl_error"], LN2 - 0.5)
    js = 0.5 * (1 / 0.75 - 1 - L(1 / 0.75)) + 0.5 * (0.5 / 0.75 - 1 - L(0.5 / 0.75))
    close(m["js_divergence_error"], js)
    close(m["approx_entropy"], -0.5 * L(0.25))


# ---------------------------------------------------------------- edge cases


def test_fully_masked_rows_and_nonfinite_padding_are_ignored():
    # row 1 is fully masked and holds NaN/-inf everywhere; row 0's second token is padding with -inf
    curr = torch.tensor([[L(1.1), float("-inf")], [float("nan"), float("-inf")]], dtype=torch.float64,
                        requires_grad=True)
    prev = torch.tensor([[0.0, float("nan")], [float("-inf"), float("nan")]], dtype=torch.float64)
    loss, m = clipped_pg_loss(
        curr_logprobs=curr, prev_logprobs=prev, generation_logprobs=prev, reference_logprobs=prev,
        advantages=torch.tensor([[1.0, float("nan")], [float("nan"), 1.0]], dtype=torch.float64),
        token_mask=torch.tensor([[1.0, 0.0], [1.0, 1.0]]), sample_mask=torch.tensor([1.0, 0.0]),
        global_valid_tokens=1, global_valid_seqs=1,
    )
    loss.backward()
    # only token (0,0): −A·r = −1.1, plus β·k3 with log r = ref − curr = −ln 1.1: 0.01·(1/1.1 − 1 + ln 1.1)
    close(loss, -1.1 + 0.01 * (1 / 1.1 - 1 + L(1.1)))
    assert torch.isfinite(curr.grad).all()
    assert all(torch.isfinite(v) for k, v in m.items() if not k.endswith(("_min", "_max")))


def test_nonfinite_curr_on_a_valid_token_is_dropped():
    # token (0,1) has curr = −inf (top-k filtering mismatch): excluded; only (0,0) counts
    loss, _, grad = pg([[0.0, float("-inf")]], [[1.0, 1.0]], n_tok=1)
    close(loss, -1.0)
    close(grad, [[-1.0, 0.0]])


def test_empty_batch_and_zero_counts():
    loss, m, grad = pg(torch.zeros(0, 3), torch.zeros(0), n_tok=0, n_seq=0)
    close(loss, 0.0)
    assert grad.shape == (0, 3)
    assert m["probs_ratio_min"] == float("inf") and m["probs_ratio_max"] == float("-inf")
    # all-masked micro-batch with zero global counts: 0, not NaN
    loss, m, _ = pg(torch.zeros(2, 2), [1.0, 1.0], sm=[0.0, 0.0], n_tok=0, n_seq=0, token_level_loss=False)
    close(loss, 0.0)


def test_missing_inputs_and_bad_options_raise():
    with pytest.raises(ValueError, match="reference_logprobs"):
        pg([[0.0]], [1.0], reference_policy_kl_penalty=0.1)
    with pytest.raises(ValueError, match="ratio_clip_c = 0.5"):
        pg([[0.0]], [1.0], ratio_clip_c=0.5)
    with pytest.raises(ValueError, match="rewards"):
        pg([[0.0]], [1.0], positive_example_nll_weight=0.1)


def test_kl_estimate_unknown_type():
    with pytest.raises(ValueError, match="k4"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "k4")


# ---------------------------------------------------------------- NLL and value losses


def test_nll_loss_token_mean_over_global_tokens():
    # −(−1 − 2 − 3)/3 = 2; NaN on the padding is ignored; with 6 global tokens the share is 1
    lp = torch.tensor([[-1.0, -2.0], [-3.0, float("nan")]], requires_grad=True)
    tm = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, m = nll_loss(lp, tm, 3)
    loss.backward()
    close(loss, 2.0)
    close(lp.grad, [[-1 / 3, -1 / 3], [-1 / 3, 0.0]])
    close([m["num_unmasked_tokens"], m["num_valid_samples"]], [3.0, 2.0])
    close(nll_loss(lp, tm, 6)[0], 1.0)
    close(nll_loss(lp, tm, 3, sample_mask=torch.tensor([1.0, 0.0]))[0], 1.0)  # (1 + 2)/3


def test_value_loss_clipped_and_unclipped_with_metrics():
    # v = [1, 2], v_old = [1.5, 1.5], R = [0, 3]; clip 0.2: v_clip = [1.3, 1.7]
    # (v − R)² = [1, 1]; (v_clip − R)² = [1.69, 1.69] -> max = 1.69 each; L = 0.5·3.38/2 = 0.845; clipfrac 1
    v = torch.tensor([[1.0, 2.0]], requires_grad=True)
    args = (torch.tensor([[1.5, 1.5]]), torch.tensor([[0.0, 3.0]]), torch.ones(1, 2), 2)
    loss, m = value_loss(v, *args, clip_range=0.2)
    close(loss, 0.845)
    close(m["vf_clipfrac"], 1.0)
    loss, m = value_loss(v, *args)
    close(loss, 0.5)  # 0.5·(1 + 1)/2
    loss.backward()
    close(v.grad, [[0.5, -0.5]])  # 0.5·2·(v − R)/2
    close(value_loss(v, *args, scale=0.4)[0], 0.2)
    close([m["returns_mean"], m["values_mean"], m["returns_sq_mean"], m["residual_sq_mean"]], [1.5, 1.5, 4.5, 1.0])
    close([m["values_min"], m["values_max"]], [1.0, 2.0])
    # EV = 1 − (E[(R−V)²] − (μR − μV)²)/(E[R²] − μR²) = 1 − (1 − 0)/(4.5 − 2.25) = 5/9
    close(explained_variance(m["returns_mean"], m["values_mean"], m["returns_sq_mean"], m["residual_sq_mean"]), 5 / 9)


def test_value_loss_masks_padding():
    v = torch.tensor([[1.0, float("nan")]], requires_grad=True)
    loss, _ = value_loss(v, torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]), 1, clip_range=0.5)
    loss.backward()
    # v_clip = clamp(1, −0.5, 0.5) = 0.5: max(1, 0.25) = 1 -> 0.5
    close(loss, 0.5)
    assert torch.isfinite(v.grad).all()


@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3"])
def test_on_policy_kl_gradient_is_zero_where_the_input_clamp_is_active(kl_type):
    # issue 16 item 6: curr = −25, gen = −20, ref = 0 -> log ρ = ref − curr = 25, clamped to 20.
    # The clamped k(20) is a constant, and the importance weight w = exp(curr − gen) must be
    # detached there too (kl.py's contract; NeMo RL's calculate_kl does torch.where(logr ==
    # logr_clamped, w, w.detach())). Otherwise d/dcurr [w·k] = w·k(20) ≠ 0: for k1
    # w·(−20) = e^−5·(−20) = −0.135. Output clamp off so only the input clamp acts.
    _, m, grad = pg([[-25.0]], [0.0], prev=[[-20.0]], ref=[[0.0]], reference_policy_kl_penalty=1.0,
                    reference_policy_kl_type=kl_type, use_on_policy_kl_approximation=True,
                    kl_output_clamp_value=None)
    k = {"k1": -20.0, "k2": 200.0, "k3": math.exp(20.0) - 21.0}[kl_type]
    close(m["kl_penalty"], math.exp(-5.0) * k, tol=1e-6)  # the value keeps the weight
    close(grad, [[0.0]], tol=0.0)


def test_kl_estimate_importance_weight_detached_only_where_clamped():
    # two tokens, ref = 0: token 0 log ρ = 1 (inside the clamp 2), token 1 log ρ = 5 (clamped).
    # k1 with w = exp(lp − gen), gen = 0: token 0 gets d/dlp [e^lp·(−(0 − lp))] = e^lp·lp + e^lp
    # = e^−1·(−1) + e^−1 = 0; take lp = −0.5 instead: e^−0.5·(−0.5 + 1) = 0.5·e^−0.5.
    lp = torch.tensor([-0.5, -5.0], requires_grad=True)
    w = torch.exp(lp - torch.zeros(2))
    kl = kl_estimate(lp, torch.zeros(2), "k1", input_clamp_value=2.0, importance_weights=w)
    kl.sum().backward()
    close(lp.grad, [0.5 * math.exp(-0.5), 0.0])


def test_sequence_logprob_error_metrics_every_step():
    # |gen − prev| per token: row 0 [ln2, 0] -> (2 + 1)/2 = 1.5; row 1 [0 (masked), ln4] -> 4;
    # row 2 has sample_mask 0 (not counted); row 3 has no valid token (not counted, but in n_seq).
    prev = [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]
    gen = [[LN2, 0.0], [5.0, -L(4.0)], [1.0, 1.0], [0.0, 0.0]]
    tm = [[1, 1], [0, 1], [1, 1], [0, 0]]
    sm = [1.0, 1.0, 0.0, 1.0]
    _, m, _ = pg([[0.0, 0.0]] * 4, [[0.0, 0.0]] * 4, prev=prev, gen=gen, tm=tm, sm=sm)
    close([m["min_seq_mult_prob_error"], m["max_seq_mult_prob_error"]], [1.5, 4.0])
    close(m["mean_seq_mult_prob_error"], (1.5 + 4.0) / 3)  # over the global valid sequences (n_seq = 3)
    # no valid sequence: neutral extrema (the reducers skip them), mean 0
    _, m, _ = pg([[0.0, 0.0]], [[0.0, 0.0]], prev=[[0.0, 0.0]], gen=[[1.0, 1.0]], sm=[0.0], n_seq=1.0)
    assert (m["min_seq_mult_prob_error"], m["max_seq_mult_prob_error"]) == (math.inf, -math.inf)
    close(m["mean_seq_mult_prob_error"], 0.0)
