"""Logit processing: temperature, top-k and top-p masks, hand-computed and against transformers."""

import math

import pytest
import torch
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from rlplane.generation import apply_top_k, apply_top_p, process_logits, sample


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
    assert torch.equal(torch.isinf(apply_top_k(logits, top_k)), torch.isinf(TopKLogitsWarper(top_k)(None, logits.clone())))


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
