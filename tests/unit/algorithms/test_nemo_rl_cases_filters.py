"""NeMo RL's own unit-test cases for reward scaling/shaping, dynamic sampling and the
sequence-level logprob-error mask, ported to rlplane (same inputs, same expected numbers).

Sources (NVIDIA-NeMo/RL, commit 7ea279ab): ``tests/unit/algorithms/test_reward_functions.py``;
``test_grpo.py`` (``test_dapo_dynamic_sampling_*``, ``TestComputeAndApplySeqLogprobErrorMasking``).
NeMo works on a batch dict (message logs, ``total_reward``, ``truncated``); rlplane's functions take
the tensors (rewards, response lengths, truncation flags), so the ports pass those. NeMo slices
logprobs and masks with ``[:, 1:]``; the ports pass the sliced tensors. Written for rlplane.
"""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from rlplane.algorithms import (
    apply_reward_shaping,
    dynamic_sampling_keep_mask,
    dynamic_sampling_select,
    scale_rewards,
    seq_logprob_error_mask,
)
from rlplane.config.algorithms import RewardShapingConfig

T = torch.tensor


def close(a, b, tol=1e-6):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               atol=tol, rtol=tol)


# ---------------------------------------------------------------- test_reward_functions.py: scaling


def test_reward_scaling_disabled():
    r = T([1.0, 0.5, 0.8])
    assert scale_rewards(r, enabled=False) is r  # test_reward_functions.py::test_reward_scaling_disabled


def test_reward_scaling_base():
    # test_reward_functions.py::test_reward_scaling_base: [0, 1] -> [0, 0.7]: r·0.7
    close(scale_rewards(T([1.0, 0.5, 0.8]), source_min=0.0, source_max=1.0, target_min=0.0, target_max=0.7),
          [0.7, 0.35, 0.56])


def test_reward_scaling_dapo():
    # test_reward_functions.py::test_reward_scaling_dapo: 0/1 -> −1/1
    close(scale_rewards(T([1.0, 0.0, 0.0, 1.0, 0.0]), source_min=0.0, source_max=1.0, target_min=-1.0, target_max=1.0),
          [1.0, -1.0, -1.0, 1.0, -1.0])


def test_reward_scaling_clipping():
    # test_reward_functions.py::test_reward_scaling_clipping: clamp to [−2, 2], then −1 + (r + 2)/4·2
    close(scale_rewards(T([-2.8, -0.25, 1.5, 0.5, 2.0, 2.5]), source_min=-2.0, source_max=2.0, target_min=-1.0,
                        target_max=1.0),
          [-1.0, -0.125, 0.75, 0.25, 1.0, 1.0])


# ---------------------------------------------------------------- test_reward_functions.py: shaping

DAPO = {"overlong_buffer_length": 5, "max_response_length": 25}  # expected length 20


def shape(rewards, lengths, truncated=None, **cfg):
    r = T(rewards)
    trunc = torch.zeros(len(rewards), dtype=torch.bool) if truncated is None else T(truncated)
    return r, apply_reward_shaping(r, T(lengths), trunc, **cfg)


def test_reward_shaping_disabled():
    # test_reward_functions.py::test_reward_shaping_disabled
    r, out = shape([1.0, 0.5, 0.8], [10, 20, 30], enabled=False, overlong_buffer_penalty=0.1, **DAPO)
    assert out is r


def test_reward_shaping_no_penalties():
    # test_reward_functions.py::test_reward_shaping_no_penalties: every length ≤ 20
    _, out = shape([1.0, 0.5, 0.8], [10, 15, 18], enabled=True, overlong_buffer_penalty=1.0, **DAPO)
    close(out, [1.0, 0.5, 0.8])


def test_reward_shaping_with_penalties():
    # test_reward_functions.py::test_reward_shaping_with_penalties: min(−(L − 20)/5·0.5, 0):
    # L = 22 -> −0.2, 25 -> −0.5, 30 -> −1.0
    _, out = shape([1.0, 0.8, 0.6, 0.4], [10, 22, 25, 30], enabled=True, overlong_buffer_penalty=0.5, **DAPO)
    close(out, [1.0, 0.6, 0.1, -0.6])


def test_reward_shaping_preserves_unshaped_reward_overlong():
    # test_reward_functions.py::test_reward_shaping_preserves_unshaped_reward_overlong: shaping
    # returns a new tensor; the caller's unshaped reward (for dynamic sampling) is left as it was
    r, out = shape([0.0, 0.0, 0.0, 0.0], [10, 22, 25, 30], enabled=True, overlong_buffer_penalty=0.5, **DAPO)
    close(out, [0.0, -0.2, -0.5, -1.0])
    close(r, [0.0, 0.0, 0.0, 0.0])
    assert out.data_ptr() != r.data_ptr()


def test_reward_shaping_preserves_unshaped_reward_stop_properly():
    # test_reward_functions.py::test_reward_shaping_preserves_unshaped_reward_stop_properly
    r, out = shape([1.0, 0.8, 0.6, 0.4], [10, 20, 30, 40], [False, True, False, True], enabled=True,
                   stop_properly_penalty_coef=0.5)
    close(r, [1.0, 0.8, 0.6, 0.4])
    assert out.data_ptr() != r.data_ptr()


def test_reward_shaping_optional_defaults():
    # test_reward_functions.py::test_reward_shaping_optional_defaults_are_none: NeMo's overlong
    # parameters default to None; rlplane's default to the DAPO paper's 128 / 1.0 (a deliberate
    # difference, docs/algorithms.md). max_response_length and the coefficient are None in both.
    cfg = RewardShapingConfig()
    assert (cfg.overlong_buffer_length, cfg.overlong_buffer_penalty) == (128, 1.0)
    assert cfg.max_response_length is None and cfg.stop_properly_penalty_coef is None


@pytest.mark.parametrize("missing", ["overlong_buffer_length", "overlong_buffer_penalty", "max_response_length"])
def test_reward_shaping_missing_config_values(missing):
    # test_reward_functions.py::test_reward_shaping_missing_config_values: each DAPO parameter missing
    cfg = {"overlong_buffer_length": 5, "overlong_buffer_penalty": 0.1, "max_response_length": 25, missing: None}
    with pytest.raises(ValueError, match="overlong_buffer_length, overlong_buffer_penalty and max_response_length"):
        shape([1.0], [20], enabled=True, **cfg)
    with pytest.raises(ValidationError, match=missing):
        RewardShapingConfig(enabled=True, **cfg)


def test_stop_properly_penalty():
    # test_reward_functions.py::test_stop_properly_penalty: truncated rewards × 0.5
    _, out = shape([1.0, 0.8, 0.6, 0.4], [10, 20, 30, 40], [False, True, False, True], enabled=True,
                   stop_properly_penalty_coef=0.5)
    close(out, [1.0, 0.4, 0.6, 0.2])


def test_stop_properly_penalty_boundary_coefs():
    # test_reward_functions.py::test_stop_properly_penalty_boundary_coefs: coef 0 zeroes, 1 keeps
    _, out = shape([1.0, 0.5], [10, 20], [True, True], enabled=True, stop_properly_penalty_coef=0.0)
    close(out, [0.0, 0.0])
    _, out = shape([1.0, 0.5], [10, 20], [True, True], enabled=True, stop_properly_penalty_coef=1.0)
    close(out, [1.0, 0.5])


@pytest.mark.parametrize("coef", [-0.1, 1.5])
def test_stop_properly_penalty_error_cases(coef):
    # test_reward_functions.py::test_stop_properly_penalty_error_cases (the coefficient range; the
    # "truncated field not found" case does not apply: truncation is a required argument here)
    with pytest.raises(ValidationError, match=r"stop_properly_penalty_coef = .*: needs a value in \[0, 1\]"):
        RewardShapingConfig(enabled=True, stop_properly_penalty_coef=coef)


# ---------------------------------------------------------------- test_grpo.py: dynamic sampling

P2 = T([[1, 2, 3]] * 3 + [[4, 5, 6]] * 3)


def test_dapo_dynamic_sampling_filters_nonzero_std():
    # test_grpo.py::test_dapo_dynamic_sampling_filters_nonzero_std: both groups vary -> all 6 kept
    keep = dynamic_sampling_keep_mask(P2, T([1.0, 0.0, 1.0, 0.5, 0.5, 0.0]))
    sel = dynamic_sampling_select([keep], target_num_samples=6, dynamic_sampling_max_gen_batches=5)
    assert sel is not None and sel.indices[0].tolist() == [0, 1, 2, 3, 4, 5]


def test_dapo_dynamic_sampling_filters_zero_std():
    # test_grpo.py::test_dapo_dynamic_sampling_filters_zero_std: group 0 all 1.0 is dropped; target 1·3
    r = T([1.0, 1.0, 1.0, 0.5, 0.5, 0.0])
    sel = dynamic_sampling_select([dynamic_sampling_keep_mask(P2, r)], 3, 5)
    assert sel is not None and sel.indices[0].tolist() == [3, 4, 5]
    close(r[sel.indices[0]], [0.5, 0.5, 0.0])


def test_dapo_dynamic_sampling_preserves_mask_sample_alignment():
    # test_grpo.py::test_dapo_dynamic_sampling_preserves_mask_sample_alignment: rows (and any per-row
    # flag) follow the selection: target 2·3 of 9 kept rows -> the first 6
    p = T([[0]] * 3 + [[1]] * 3 + [[2]] * 3)
    r = T([1.0, 0.0, 1.0, 0.5, 0.0, 0.5, 0.2, 0.6, 0.9])
    flag = T([False, True, False, True, False, True, False, False, True])
    sel = dynamic_sampling_select([dynamic_sampling_keep_mask(p, r)], 6, 5)
    assert sel is not None and torch.equal(flag[sel.indices[0]], T([False, True, False, True, False, True]))


def test_dapo_dynamic_sampling_batch_caching():
    # test_grpo.py::test_dapo_dynamic_sampling_batch_caching: one varied group of 3, target 2·3:
    # the first batch is not enough (None: generate again); with a second batch it completes
    keep = dynamic_sampling_keep_mask(T([[1, 2, 3]] * 3), T([1.0, 0.0, 0.5]))
    assert dynamic_sampling_select([keep], 6, 5) is None
    sel = dynamic_sampling_select([keep, keep], 6, 5)
    assert sel is not None and sel.num_gen_batches == 2 and sum(len(i) for i in sel.indices) == 6


def test_dapo_dynamic_sampling_filters_on_raw_metric_after_overlong_shaping():
    # test_grpo.py::test_dapo_dynamic_sampling_filters_on_raw_metric_after_overlong_shaping: group 0
    # is all wrong (0) with lengths 10, 22, 30 -> shaped [0, −0.2, −1.0] (spread!); group 1 [1, 0, 1]
    raw = T([0.0, 0.0, 0.0, 1.0, 0.0, 1.0])
    shaped = apply_reward_shaping(raw, T([10, 22, 30, 10, 20, 10]), torch.zeros(6, dtype=torch.bool), enabled=True,
                                  overlong_buffer_length=5, overlong_buffer_penalty=0.5, max_response_length=25)
    close(shaped[:3], [0.0, -0.2, -1.0])
    assert dynamic_sampling_keep_mask(P2, shaped)[:3].all()  # the shaped reward would keep the wrong group
    keep = dynamic_sampling_keep_mask(P2, raw)  # the raw metric drops it
    sel = dynamic_sampling_select([keep], 3, 5)
    assert sel is not None and sel.indices[0].tolist() == [3, 4, 5]


# ---------------------------------------------------------------- test_grpo.py: seq logprob-error mask


def seq_case(gen_full, tm_full=None, sm=None, rewards=None, threshold=None):
    """NeMo's (B, S) tensors with its [:, 1:] slice, then rlplane's seq_logprob_error_mask."""
    b, s = gen_full.shape
    tm_full = torch.ones(b, s) if tm_full is None else tm_full
    sm = torch.ones(b) if sm is None else sm
    return seq_logprob_error_mask(gen_full[:, 1:], torch.zeros(b, s - 1), tm_full[:, 1:], sm, threshold,
                                  rewards=rewards)


def test_no_threshold_only_computes_metrics():
    # test_grpo.py::TestComputeAndApplySeqLogprobErrorMasking::test_no_threshold_only_computes_metrics
    gen = torch.zeros(4, 10)
    for i, c in enumerate([0.1, 0.5, 1.0, 2.0]):
        gen[i, 1:5] = c
    sm = torch.ones(4)
    new, m = seq_case(gen, sm=sm, rewards=T([1.0, 0.0, 1.0, 0.0]))
    assert m["max_seq_mult_prob_error"] > 0 and m["num_masked_seqs_by_logprob_error"] == 0
    assert m["masked_correct_pct"] == 0.0 and torch.equal(new, sm)


def test_masking_with_threshold():
    # ...::test_masking_with_threshold: 9 tokens, 4 with error c: (4e^c + 5)/9 = 1.047, 1.047, 1.288, 1.764
    gen = torch.zeros(4, 10)
    for i, c in enumerate([0.1, 0.1, 0.5, 1.0]):
        gen[i, 1:5] = c
    new, m = seq_case(gen, rewards=T([1.0, 0.0, 1.0, 0.0]), threshold=1.2)
    assert m["num_masked_seqs_by_logprob_error"] == 2 and m["masked_correct_pct"] == 0.5
    close(new, [1.0, 1.0, 0.0, 0.0])


def test_no_sequences_masked_when_all_below_threshold():
    # ...::test_no_sequences_masked_when_all_below_threshold
    gen = torch.zeros(3, 8)
    gen[:, 1:4] = 0.05
    new, m = seq_case(gen, rewards=torch.ones(3), threshold=2.0)
    assert m["num_masked_seqs_by_logprob_error"] == 0 and m["masked_correct_pct"] == 0.0
    close(new, torch.ones(3))


def test_all_sequences_masked_when_all_above_threshold():
    # ...::test_all_sequences_masked_when_all_above_threshold
    gen = torch.zeros(3, 8)
    gen[:, 1:4] = 1.0
    new, m = seq_case(gen, rewards=T([1.0, 0.0, 1.0]), threshold=1.0)
    assert m["num_masked_seqs_by_logprob_error"] == 3
    assert m["masked_correct_pct"].item() == pytest.approx(2 / 3, rel=1e-5)
    close(new, torch.zeros(3))


def test_respects_existing_sample_mask():
    # ...::test_respects_existing_sample_mask: row 1 already masked is not counted again
    gen = torch.zeros(4, 8)
    gen[:, 1:4] = 1.0
    new, m = seq_case(gen, sm=T([1.0, 0.0, 1.0, 1.0]), rewards=T([1.0, 1.0, 0.0, 1.0]), threshold=1.0)
    assert m["num_masked_seqs_by_logprob_error"] == 3
    assert m["masked_correct_pct"].item() == pytest.approx(2 / 3, rel=1e-5)
    close(new, torch.zeros(4))


def test_masked_correct_pct_calculation():
    # ...::test_masked_correct_pct_calculation: rows 2–4 have (3e^1.5 + 4)/7 = 2.49 > 1.5
    gen = torch.zeros(5, 8)
    gen[2:5, 1:4] = 1.5
    _, m = seq_case(gen, rewards=T([0.0, 0.0, 1.0, 0.0, 1.0]), threshold=1.5)
    assert m["num_masked_seqs_by_logprob_error"] == 3
    assert m["masked_correct_pct"].item() == pytest.approx(2 / 3, rel=1e-5)


def test_token_mask_is_respected():
    # ...::test_token_mask_is_respected: row 0 keeps 4 tokens, 2 with error: (2e + 2)/4 = 1.859 ≤ 2;
    # row 1: (5e + 2)/7 = 2.227 > 2 -> only row 1 masked
    gen = torch.zeros(2, 8)
    gen[:, 1:6] = 1.0
    tm = torch.ones(2, 8)
    tm[0, 3:6] = 0.0
    new, m = seq_case(gen, tm, rewards=T([1.0, 0.0]), threshold=2.0)
    assert m["num_masked_seqs_by_logprob_error"] == 1 and m["masked_correct_pct"] == 0.0
    close(new, [1.0, 0.0])


def test_fully_token_masked_sequences_are_excluded_from_metrics():
    # ...::test_fully_token_masked_sequences_are_excluded_from_metrics (issue 16 item 5): errors
    # 2, 4 and a row with no valid token -> max/mean/min 4/3/2; threshold 3 masks row 1 (reward 1)
    gen = torch.zeros(3, 3)
    gen[:, 1] = torch.log(T([2.0, 4.0, 16.0]))
    tm = T([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    new, m = seq_case(gen, tm, rewards=T([0.0, 1.0, 1.0]), threshold=3.0)
    close([m["max_seq_mult_prob_error"], m["mean_seq_mult_prob_error"], m["min_seq_mult_prob_error"]], [4.0, 3.0, 2.0],
          1e-5)
    assert m["num_masked_seqs_by_logprob_error"] == 1 and m["masked_correct_pct"] == 1.0
    close([m["max_seq_mult_prob_error_after_mask"], m["mean_seq_mult_prob_error_after_mask"],
           m["min_seq_mult_prob_error_after_mask"]], [2.0, 2.0, 2.0], 1e-5)
    close(new, [1.0, 0.0, 1.0])


def test_empty_batch_returns_zero_metrics():
    # ...::test_empty_batch_returns_zero_metrics
    _, m = seq_logprob_error_mask(torch.zeros(0, 7), torch.zeros(0, 7), torch.zeros(0, 7), torch.zeros(0), 1.5,
                                  rewards=torch.zeros(0))
    assert m["max_seq_mult_prob_error"] == 0.0 and m["num_masked_seqs_by_logprob_error"] == 0
    assert m["masked_correct_pct"] == 0.0


def test_threshold_boundary_values():
    # ...::test_threshold_boundary_values: exp(0.4) = 1.492 kept, exp(0.41) = 1.507 masked at 1.5
    gen = torch.zeros(3, 8)
    gen[:, 1] = T([0.4, 0.405, 0.41])
    tm = torch.zeros(3, 8)
    tm[:, 1] = 1.0
    new, m = seq_case(gen, tm, rewards=torch.ones(3), threshold=1.5)
    assert m["num_masked_seqs_by_logprob_error"] >= 1 and new[0] == 1.0 and new[2] == 0.0
    assert math.isclose(m["max_seq_mult_prob_error"].item(), math.exp(0.41), rel_tol=1e-5)
