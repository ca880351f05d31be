"""Hand-computed tests for dynamic sampling, overlong filtering/shaping, reward scaling and
sequence-level logprob-error masking."""

from __future__ import annotations

import math

import pytest
import torch

from rlplane.algorithms import (
    apply_reward_shaping,
    dapo_overlong_penalty,
    dynamic_sampling_keep_mask,
    dynamic_sampling_select,
    overlong_filter_sample_mask,
    scale_rewards,
    seq_logprob_error_mask,
    seq_mult_prob_error,
    stop_properly_penalty,
)


def close(a, b, tol=1e-6):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               atol=tol, rtol=tol)


def test_dynamic_sampling_keeps_groups_with_reward_spread():
    # groups: 0 -> [1, 1] (all equal, drop), 1 -> [0, 1] (keep), 2 -> [0, 0, 0] (drop),
    # 3 -> [1, 0, 0, 0] (keep all four)
    p = torch.tensor([0, 0, 1, 1, 2, 2, 2, 3, 3, 3, 3])
    r = torch.tensor([1.0, 1, 0, 1, 0, 0, 0, 1, 0, 0, 0])
    keep = dynamic_sampling_keep_mask(p, r)
    assert keep.tolist() == [False, False, True, True, False, False, False, True, True, True, True]


def test_dynamic_sampling_valid_mask_and_2d_prompts_and_group_of_one():
    p = torch.tensor([[1, 2], [1, 2], [3, 4]])
    # the differing sample of group [1,2] is invalid -> remaining valid rewards all equal -> drop; group of 1 -> drop
    keep = dynamic_sampling_keep_mask(p, torch.tensor([1.0, 0.0, 5.0]), valid_mask=torch.tensor([1, 0, 1]))
    assert keep.tolist() == [False, False, False]
    assert dynamic_sampling_keep_mask(torch.zeros(0, dtype=torch.long), torch.zeros(0)).shape == (0,)


def test_dynamic_sampling_select_accumulates_and_slices():
    target = 4
    b1 = torch.tensor([True, True, False, False])
    assert dynamic_sampling_select([b1], target, 10) is None  # 2 of 4: generate more
    b2 = torch.tensor([False, False, True, True, True, True])
    sel = dynamic_sampling_select([b1, b2], target, 10)
    assert [i.tolist() for i in sel.indices] == [[0, 1], [2, 3]]
    assert sel.num_gen_batches == 2 and sel.num_discarded_valid_samples == 2  # kept 6, used 4


def test_dynamic_sampling_select_fill_tops_up_in_generation_order():
    # Target 6; kept: batch 1 rows 0,1 (2). Short after 2 batches: fill 4 with dropped rows in order:
    # batch 1 rows 2,3, then batch 2 rows 0,1. Indices come back sorted per batch.
    b1, b2 = torch.tensor([True, True, False, False]), torch.tensor([False, False, False, False])
    sel = dynamic_sampling_select([b1, b2], 6, 2, fill=True)
    assert [i.tolist() for i in sel.indices] == [[0, 1, 2, 3], [0, 1]]
    assert (sel.num_gen_batches, sel.num_discarded_valid_samples, sel.num_filled_samples) == (2, 0, 4)
    # Before the last batch, fill waits for more batches like the default.
    assert dynamic_sampling_select([b1], 6, 2, fill=True) is None
    # Kept rows interleaved with dropped ones: kept first, then the earliest dropped, in row order.
    sel = dynamic_sampling_select([torch.tensor([False, False, True, True, False, False])], 4, 1, fill=True)
    assert sel.indices[0].tolist() == [0, 1, 2, 3] and sel.num_filled_samples == 2


def test_dynamic_sampling_select_raises_after_max_batches():
    with pytest.raises(RuntimeError, match="dynamic_sampling_max_gen_batches = 2"):
        dynamic_sampling_select([torch.tensor([True, False]), torch.tensor([False, False])], 4, 2)
    with pytest.raises(ValueError, match="dynamic_sampling_max_gen_batches = 0"):
        dynamic_sampling_select([torch.tensor([True])], 1, 0)


def test_overlong_filter():
    close(overlong_filter_sample_mask(torch.tensor([1.0, 1.0, 0.5]), torch.tensor([True, False, False])),
          [0.0, 1.0, 0.5])


def test_dapo_overlong_penalty():
    # max 20, buffer 4, penalty 1 -> expected = 16; penalty = min(−(L − 16)/4, 0)
    # L = [10, 16, 18, 20, 24] -> [0, 0, −0.5, −1, −2]
    r = torch.ones(5)
    out = dapo_overlong_penalty(r, torch.tensor([10, 16, 18, 20, 24]), overlong_buffer_length=4,
                                overlong_buffer_penalty=1.0, max_response_length=20)
    close(out, [1.0, 1.0, 0.5, 0.0, -1.0])


def test_stop_properly_penalty_and_reward_shaping_dispatch():
    r, lengths, trunc = torch.tensor([1.0, 1.0]), torch.tensor([18, 18]), torch.tensor([True, False])
    close(stop_properly_penalty(r, trunc, 0.5), [0.5, 1.0])
    close(apply_reward_shaping(r, lengths, trunc, enabled=False), [1.0, 1.0])
    # coef set: only the truncation penalty (overlong params ignored)
    close(apply_reward_shaping(r, lengths, trunc, enabled=True, stop_properly_penalty_coef=0.0,
                               max_response_length=20, overlong_buffer_length=4), [0.0, 1.0])
    close(apply_reward_shaping(r, lengths, trunc, enabled=True, overlong_buffer_length=4, overlong_buffer_penalty=1.0,
                               max_response_length=20), [0.5, 0.5])
    with pytest.raises(ValueError, match="max_response_length"):
        apply_reward_shaping(r, lengths, trunc, enabled=True)


def test_scale_rewards():
    # [0, 1] -> [−1, 1]: clamp then r' = −1 + r·2:
    # [−0.5, 0, 0.25, 1, 2] -> clamp [0, 0, 0.25, 1, 1] -> [−1, −1, −0.5, 1, 1]
    r = torch.tensor([-0.5, 0.0, 0.25, 1.0, 2.0])
    close(scale_rewards(r, source_min=0.0, source_max=1.0, target_min=-1.0, target_max=1.0),
          [-1.0, -1.0, -0.5, 1.0, 1.0])
    assert scale_rewards(r, enabled=False) is r


def test_seq_logprob_error_and_masking():
    # row 0: |gen − prev| = [ln 2, 0] -> (2 + 1)/2 = 1.5 ; row 1: [0, 0(masked)] -> 1 ; row 2: sample_mask 0 -> 0
    gen = torch.tensor([[math.log(0.5), -1.0], [-1.0, float("-inf")], [0.0, 0.0]])
    prev = torch.tensor([[0.0, -1.0], [-1.0, -3.0], [-5.0, -5.0]])
    tm = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    sm = torch.tensor([1.0, 1.0, 0.0])
    close(seq_mult_prob_error(gen, prev, tm, sm), [1.5, 1.0, 0.0])
    new_sm, m = seq_logprob_error_mask(gen, prev, tm, sm, 1.2, rewards=torch.tensor([1.0, 0.0, 1.0]))
    close(new_sm, [0.0, 1.0, 0.0])
    close([m["max_seq_mult_prob_error"], m["mean_seq_mult_prob_error"], m["min_seq_mult_prob_error"]], [1.5, 1.25, 1.0])
    close([m["max_seq_mult_prob_error_after_mask"], m["mean_seq_mult_prob_error_after_mask"]], [1.0, 1.0])
    close([m["num_masked_seqs_by_logprob_error"], m["masked_correct_pct"]], [1.0, 1.0])
    same, m = seq_logprob_error_mask(gen, prev, tm, sm, None)
    close(same, sm)
    close(m["num_masked_seqs_by_logprob_error"], 0.0)


def test_seq_logprob_error_metrics_skip_sequences_without_valid_tokens():
    # issue 16 item 5. One token per row: row 0 |gen − prev| = ln 2 -> err 2; row 1 ln 4 -> err 4;
    # row 2 has sample_mask 1 but no valid token (token_mask 0): it has no error at all and must
    # not enter the statistics (NeMo RL's valid_seq_mask = Σ_t m > 0).
    # over rows 0, 1: max 4, mean (2 + 4)/2 = 3, min 2 (counting row 2 as 0 gave mean 2, min 0)
    gen = torch.tensor([[math.log(2.0)], [math.log(4.0)], [7.0]])
    prev = torch.zeros(3, 1)
    tm = torch.tensor([[1.0], [1.0], [0.0]])
    sm = torch.ones(3)
    new_sm, m = seq_logprob_error_mask(gen, prev, tm, sm, None)
    close([m["max_seq_mult_prob_error"], m["mean_seq_mult_prob_error"], m["min_seq_mult_prob_error"]], [4.0, 3.0, 2.0])
    close([m["max_seq_mult_prob_error_after_mask"], m["mean_seq_mult_prob_error_after_mask"],
           m["min_seq_mult_prob_error_after_mask"]], [4.0, 3.0, 2.0])
    close(new_sm, sm)
    # threshold 3: row 1 is masked (4 > 3); row 2 is not "masked" (it has no error to exceed);
    # after the mask only row 0 remains -> 2/2/2
    new_sm, m = seq_logprob_error_mask(gen, prev, tm, sm, 3.0, rewards=torch.tensor([1.0, 1.0, 0.0]))
    close(new_sm, [1.0, 0.0, 1.0])
    close([m["max_seq_mult_prob_error_after_mask"], m["mean_seq_mult_prob_error_after_mask"],
           m["min_seq_mult_prob_error_after_mask"]], [2.0, 2.0, 2.0])
    close([m["num_masked_seqs_by_logprob_error"], m["masked_correct_pct"]], [1.0, 1.0])
