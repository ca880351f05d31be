"""Logit processing: temperature, top-k and top-p masks, hand-computed and against transformers."""

import math

import pytest
import torch
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from rlplane.generation import apply_top_k, apply_top_p, process_logits, sample
from rlplane.generation.sampling import inverse_cdf_sample, sampling_logprobs


def _logits_from_probs(probs):
    return torch.tensor([probs]).log()


def test_top_p_hand_computed():
    logits = _logits_from_probs([0.05, 0.5, 0.15, 0.3])
    # sorted: 0.5, 0.3, 0.15, 0.05; mass before each: 0, 0.5, 0.8, 0.95.
    # top_p 0.8: drop where mass before >= 0.8 -> keep {0.5, 0.3}.
    assert torch.isinf(apply_top_p(logits, 0.8)).tolist() == [[True, False, True, False]]
    # top_p 0.85: 0.8 < 0.85 so 0.15 is kept too.
    assert torch.isinf(apply_top_p(logits, 0.85)).tolist() == [[True, False, False, False]]
    # Tiny top_p keeps the argmax only; top_p 1 keeps everything.
    assert torch.isinf(apply_top_p(logits, 1e-6)).tolist() == [[True, False, True, True]]
    assert torch.equal(apply_top_p(logits, 1.0), logits)


def test_top_k_hand_computed():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0], [0.0, -1.0, 5.0, 5.0]])
    assert torch.isinf(apply_top_k(logits, 2)).tolist() == [[True, False, False, True], [True, True, False, False]]
    assert torch.equal(apply_top_k(logits, 0), logits) and torch.equal(apply_top_k(logits, None), logits)
    assert torch.equal(apply_top_k(logits, 10), logits)


@pytest.mark.parametrize("top_p", [0.3, 0.7, 0.9, 0.99])
def test_top_p_matches_transformers(top_p):
    logits = torch.randn(16, 50, generator=torch.Generator().manual_seed(0)) * 2
    ours = torch.isinf(apply_top_p(logits, top_p))
    theirs = torch.isinf(TopPLogitsWarper(top_p)(None, logits.clone()))
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("top_k", [1, 5, 20])
def test_top_k_matches_transformers(top_k):
    logits = torch.randn(16, 50, generator=torch.Generator().manual_seed(1))
    assert torch.equal(torch.isinf(apply_top_k(logits, top_k)),
                       torch.isinf(TopKLogitsWarper(top_k)(None, logits.clone())))


def test_temperature_then_filters():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    out = process_logits(logits, 0.5, top_k=2, top_p=1.0)
    assert out[0, :2].tolist() == [4.0, 2.0] and math.isinf(out[0, 2])
    with pytest.raises(ValueError, match="temperature = 0"):
        process_logits(logits, 0.0, None, 1.0)


def test_sample_logprobs_are_of_processed_distribution_and_respect_masks():
    logits = torch.randn(512, 30, generator=torch.Generator().manual_seed(2))
    tokens, logprobs = sample(logits, temperature=0.7, top_k=5, top_p=0.9, generator=torch.Generator().manual_seed(3))
    processed = process_logits(logits, 0.7, 5, 0.9)
    assert not torch.isinf(processed.gather(-1, tokens[:, None])).any()  # never a masked token
    assert torch.allclose(logprobs, processed.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1))
    greedy, greedy_lp = sample(logits, temperature=0.7, greedy=True)
    assert torch.equal(greedy, logits.argmax(-1))
    assert torch.allclose(greedy_lp, (logits / 0.7).log_softmax(-1).max(-1).values)


# ---- sampling_logprobs: the one distribution the sampler draws from and the trainer scores under ---
P4 = [0.05, 0.5, 0.15, 0.3]  # token probabilities at temperature 1 (logits = log p)


def test_sampling_logprobs_hand_computed_top_k_then_top_p():
    logits = _logits_from_probs(P4)
    # top_k 3 drops 0.05; renormalised over 0.95: 0.5263, 0.3158, 0.1579.
    # top_p 0.82 on THAT distribution: mass before each (descending) is 0, 0.5263, 0.8421, and
    # 0.8421 >= 0.82 drops 0.15. Kept {0.5, 0.3}, renormalised over 0.8: 0.625, 0.375.
    # (top_p 0.82 alone would keep 0.15: its mass before is 0.8 < 0.82. top-p sees top-k's output,
    # as in vLLM and transformers.)
    lp = sampling_logprobs(logits, temperature=1.0, top_k=3, top_p=0.82)
    assert torch.isinf(lp).tolist() == [[True, False, True, False]]
    torch.testing.assert_close(lp[0, [1, 3]], torch.tensor([0.625, 0.375]).log())
    assert torch.isinf(sampling_logprobs(logits, temperature=1.0, top_k=None, top_p=0.82)).tolist() == [
        [True, False, False, False]]


def test_sampling_logprobs_hand_computed_with_temperature():
    # temperature 0.5: logits 2·log p, so q ∝ p²: 0.0025, 0.25, 0.0225, 0.09 (sum 0.365).
    # top_k 3 drops 0.0025 (sum 0.3625): 0.6897, 0.0621, 0.2483. top_p 0.8: mass before 0, 0.6897,
    # 0.9379 -> drop 0.0225. Kept {0.25, 0.09}: 0.25/0.34 = 0.73529, 0.09/0.34 = 0.26471.
    lp = sampling_logprobs(_logits_from_probs(P4), temperature=0.5, top_k=3, top_p=0.8)
    torch.testing.assert_close(lp[0].exp(), torch.tensor([0.0, 0.25 / 0.34, 0.0, 0.09 / 0.34]))


def test_sampling_logprobs_of_tokens_are_finite_and_match_the_distribution():
    logits = _logits_from_probs(P4)
    dist = sampling_logprobs(logits, temperature=1.0, top_k=3, top_p=0.8)  # kept {1, 3}: 0.625, 0.375
    for t in (1, 3):  # tokens the sampler can draw: the same number as in the distribution
        lp = sampling_logprobs(logits, temperature=1.0, top_k=3, top_p=0.8, tokens=torch.tensor([t]))
        torch.testing.assert_close(lp, dist[:, t])
    # A token just outside the set (a top-p boundary a rounding difference can move) stays finite:
    # renormalised over kept + itself, 0.15 / (0.5 + 0.3 + 0.15) = 0.15789.
    lp = sampling_logprobs(logits, temperature=1.0, top_k=3, top_p=0.8, tokens=torch.tensor([2]))
    torch.testing.assert_close(lp, torch.tensor([0.15 / 0.95]).log())
    # Batched (B, T, V) logits with (B, T) tokens, as the trainer calls it.
    big = torch.randn(3, 7, 40, generator=torch.Generator().manual_seed(4))
    toks = torch.randint(0, 40, (3, 7), generator=torch.Generator().manual_seed(5))
    out = sampling_logprobs(big, temperature=0.7, top_k=5, top_p=0.9, tokens=toks)
    assert out.shape == (3, 7) and torch.isfinite(out).all()


def test_sampler_logprobs_equal_the_trainers_function():
    """The sampler's reported logprob of each drawn token is sampling_logprobs of that token."""
    logits = torch.randn(256, 30, generator=torch.Generator().manual_seed(6)) * 3
    tokens, logprobs = sample(logits, temperature=0.8, top_k=7, top_p=0.75, generator=torch.Generator().manual_seed(7))
    trainer = sampling_logprobs(logits, temperature=0.8, top_k=7, top_p=0.75, tokens=tokens)
    assert torch.equal(logprobs, trainer) and torch.isfinite(trainer).all()


def test_gradient_flows_through_kept_logits_only():
    # d log q_t / d z_j = (1/T)(1[j = t] - q_j) over the kept set, 0 for filtered tokens (the mask
    # itself is not differentiated). T = 1, kept {1, 3} with q = 0.625, 0.375, token 1:
    # grads 1 - 0.625 = 0.375 and -0.375; tokens 0 and 2 get 0.
    logits = _logits_from_probs(P4).requires_grad_(True)
    sampling_logprobs(logits, temperature=1.0, top_k=3, top_p=0.8, tokens=torch.tensor([1])).sum().backward()
    torch.testing.assert_close(logits.grad, torch.tensor([[0.0, 0.375, 0.0, -0.375]]))
    # T = 0.5: kept {1, 3} with q = 0.73529, 0.26471: grads 2·0.26471 = 0.52941 and -0.52941.
    logits.grad = None
    sampling_logprobs(logits, temperature=0.5, top_k=3, top_p=0.8, tokens=torch.tensor([1])).sum().backward()
    torch.testing.assert_close(logits.grad, torch.tensor([[0.0, 0.18 / 0.34, 0.0, -0.18 / 0.34]]))


def test_inverse_cdf_sample_matches_the_distribution_and_skips_zero_mass():
    # Row 0: p = 0, 0.5, 0, 0.3, 0.2 (zeros first, in the middle); row 1: unnormalised 2, 0, 0, 0, 6
    # = 0.25, 0, 0, 0, 0.75 (zeros before the last token: the cdf is flat there). 200k draws per
    # row: each frequency within 0.005 of its probability (the standard error is at most
    # sqrt(0.25/200k) = 0.0011, so 0.005 is ~4.5 sigma), and a zero-mass token is never drawn.
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2], [2.0, 0.0, 0.0, 0.0, 6.0]])
    n = 200_000
    def uniforms(seed):
        return torch.rand(2 * n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)

    draws = inverse_cdf_sample(probs.repeat_interleave(n, dim=0), uniforms(0)).view(2, n)
    freq = torch.stack([torch.bincount(d, minlength=5).double() / n for d in draws])
    expected = probs.double() / probs.sum(-1, keepdim=True)
    assert (freq[expected == 0] == 0).all()
    torch.testing.assert_close(freq, expected, atol=0.005, rtol=0)
    # The same uniforms give the same tokens.
    again = inverse_cdf_sample(probs.repeat_interleave(n, dim=0), uniforms(0)).view(2, n)
    assert torch.equal(draws, again)


def test_two_level_inverse_cdf_equals_the_flat_cdf():
    # The block search (inverse_cdf_sample, vocabularies > 2 blocks) against the one-cdf reference on
    # the cases where they could part: a vocabulary not a multiple of the block (padding), blocks of no
    # mass (top-k / top-p zeros, some at the end), one token holding nearly all the mass, uniforms at 0
    # and just below 1, and targets falling exactly on block boundaries.
    from rlplane.generation.sampling import _CDF_BLOCK, _inverse_cdf_flat

    gen = torch.Generator().manual_seed(0)
    v = 7 * _CDF_BLOCK + 13
    dense = (torch.randn(64, v, generator=gen) * 3).softmax(-1)
    sparse = dense.clone()
    sparse[:, _CDF_BLOCK : 3 * _CDF_BLOCK] = 0  # two empty blocks in the middle
    sparse[:, 6 * _CDF_BLOCK :] = 0  # and the end
    peaked = dense.clone()
    peaked[:, 5 * _CDF_BLOCK + 7] = 1e6
    for probs in (dense, sparse, peaked):
        u = torch.rand(64, generator=gen, dtype=torch.float64)
        u[:4] = torch.tensor([0.0, 1 - 2**-53, 0.5, 1e-12], dtype=torch.float64)
        assert torch.equal(inverse_cdf_sample(probs, u), _inverse_cdf_flat(probs, u))
    # Each block holds mass 1 (one token of mass 1 at its start): u = k / 8 lands exactly on block k's start.
    probs = torch.zeros(1, 8 * _CDF_BLOCK)
    probs[0, ::_CDF_BLOCK] = 1.0
    u = torch.arange(8, dtype=torch.float64) / 8
    expected = (torch.arange(8) * _CDF_BLOCK).tolist()  # cdf_j > k at token k·block (right-closed search)
    rows = probs.expand(8, -1)
    assert inverse_cdf_sample(rows, u).tolist() == expected == _inverse_cdf_flat(rows, u).tolist()
    # A row whose mass ends mid-vocabulary, u · total rounding up to the total: the last token with mass.
    probs = torch.zeros(1, 4 * _CDF_BLOCK)
    probs[0, [3, _CDF_BLOCK + 5]] = torch.tensor([0.25, 0.75])
    assert inverse_cdf_sample(probs, torch.tensor([1.0], dtype=torch.float64)).tolist() == [_CDF_BLOCK + 5]
