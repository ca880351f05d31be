"""Sampling seeded per sample: the counter-based hash, inverse-CDF draws (hand-computed and against the
probabilities), and the hf backend drawing the same tokens for a row whatever batch it is in."""

from __future__ import annotations

import pytest
import torch

from rlplane.generation import HFGenerationBackend
from rlplane.generation.sampling import counter_uniforms, inverse_cdf_sample, sample, sample_seed, splitmix64
from rlplane.models import build_char_tokenizer, build_tiny_llama

MASK64 = 2**64 - 1


def splitmix64_reference(x: int) -> int:
    """Vigna's splitmix64 ``next()`` for state ``x`` in Python's unbounded ints, masked to 64 bits."""
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def signed(x: int) -> int:
    return x - 2**64 if x >= 2**63 else x


def test_splitmix64_matches_the_reference():
    # State 0: the first output of splitmix64 seeded with 0 is 0xE220A8397B1DCDAF (Vigna's code).
    assert int(splitmix64(torch.tensor([0]))[0]) == signed(0xE220A8397B1DCDAF)
    xs = torch.randint(-(2**63), 2**63 - 1, (1000,), generator=torch.Generator().manual_seed(0))
    ours = splitmix64(xs).tolist()
    assert ours == [signed(splitmix64_reference(x & MASK64)) for x in xs.tolist()]


def test_counter_uniforms_are_uniform_and_depend_on_seed_and_counter_only():
    seeds = torch.full((20_000,), sample_seed(1, "k", 0))
    u = counter_uniforms(seeds, torch.arange(20_000))
    assert u.dtype == torch.float64 and (u >= 0).all() and (u < 1).all()
    # 20 equal bins of 1000 expected each: chi-square with 19 dof, p = 0.001 at 43.8.
    counts = torch.bincount((u * 20).long(), minlength=20).double()
    assert float(((counts - 1000) ** 2 / 1000).sum()) < 43.8
    # One row at a time gives the same numbers as the whole batch.
    assert counter_uniforms(seeds[5:6], torch.tensor([5])).item() == u[5].item()


def test_sample_seed_is_stable_and_separates_its_inputs():
    a = sample_seed(42, "train/e0/p3_g1", 7)
    assert a == sample_seed(42, "train/e0/p3_g1", 7) and -(2**63) <= a < 2**63
    others = {sample_seed(43, "train/e0/p3_g1", 7), sample_seed(42, "train/e0/p3_g2", 7),
              sample_seed(42, "train/e0/p3_g1", 8)}
    assert a not in others and len(others) == 3


def test_inverse_cdf_hand_computed():
    # probs 1, 3, 0, 4 (total 8; unnormalised on purpose): cdf 1, 4, 4, 8, and token j owns [cdf_{j-1}, cdf_j).
    probs = torch.tensor([[1.0, 3.0, 0.0, 4.0]]).expand(5, 4)
    u = torch.tensor([0.0, 0.124, 0.125, 0.5, 1 - 2**-53])
    # u·8 = 0 → 0; 0.992 → 0; 1.0 → 1; 4.0 → 3 (token 2 has an empty interval); ~8 → 3.
    assert inverse_cdf_sample(probs, u).tolist() == [0, 0, 1, 3, 3]
    # A row whose last tokens have no mass: u·total rounding up to the total stays on a kept token.
    assert inverse_cdf_sample(torch.tensor([[0.25, 0.75, 0.0, 0.0]]), torch.tensor([1.0])).tolist() == [1]


def test_inverse_cdf_draws_follow_the_probabilities():
    p = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0])
    n = 20_000
    seeds = torch.tensor([sample_seed(0, f"k{i}", 0) for i in range(n)])
    tokens = inverse_cdf_sample(p.expand(n, 5), counter_uniforms(seeds, torch.full((n,), 3)))
    counts = torch.bincount(tokens, minlength=5).double()
    assert counts[4] == 0
    expected = p[:4].double() * n
    # Chi-square with 3 dof: p = 0.001 at 16.27.
    assert float(((counts[:4] - expected) ** 2 / expected).sum()) < 16.27


def test_sample_with_row_seeds_depends_on_the_row_only():
    logits = torch.randn(16, 11, generator=torch.Generator().manual_seed(1))
    seeds = torch.tensor([sample_seed(0, f"s{i}", 0) for i in range(16)])
    pos = torch.arange(16) + 5
    kw = dict(temperature=0.9, top_k=6, top_p=0.9)
    tokens, lps = sample(logits, row_seeds=seeds, positions=pos, **kw)
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(2))
    t2, l2 = sample(logits[perm], row_seeds=seeds[perm], positions=pos[perm], **kw)
    assert t2.tolist() == tokens[perm].tolist()
    torch.testing.assert_close(l2, lps[perm])
    # The drawn token is in the filtered set (finite logprob) and the draw is the processed distribution's.
    assert torch.isfinite(lps).all()
    with pytest.raises(ValueError, match="positions"):
        sample(logits, row_seeds=seeds)


# ---- the hf backend ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    model = build_tiny_llama(tok, hidden_size=32, num_layers=2, num_heads=2, seed=0).eval()
    with torch.no_grad():  # varied, prompt-dependent distributions (see test_hf_generation)
        for p in model.parameters():
            p.mul_(12 if p.dim() > 1 else 1)
    return model


def _prompts(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 10, (n,), generator=g).tolist()
    return [[1] + torch.randint(4, 21, (k - 1,), generator=g).tolist() for k in lengths]


def test_hf_rows_get_the_same_tokens_in_any_batch(model, tok):
    backend = HFGenerationBackend(model, tok)
    prompts = [p for p in _prompts(6, seed=3) for _ in range(3)]  # groups of 3, as GRPO repeats them
    seeds = [sample_seed(42, f"k{i}", 0) for i in range(len(prompts))]
    kw = dict(max_new_tokens=10, temperature=1.0, top_k=8, stop_token_ids=[7, 9])
    full = backend.generate(prompts, row_seeds=seeds, **kw)

    order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(0)).tolist()
    shuffled = backend.generate([prompts[i] for i in order], row_seeds=[seeds[i] for i in order], **kw)
    halves = [backend.generate(prompts[a:b], row_seeds=seeds[a:b], **kw) for a, b in ((0, 7), (7, len(prompts)))]
    split_ids = halves[0].output_ids + halves[1].output_ids
    split_lps = halves[0].logprobs + halves[1].logprobs
    for j, i in enumerate(order):
        assert shuffled.output_ids[j] == full.output_ids[i]
        torch.testing.assert_close(shuffled.logprobs[j], full.logprobs[i], atol=1e-5, rtol=1e-5)
    assert split_ids == full.output_ids
    for a, b in zip(split_lps, full.logprobs):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # Rows of one group share the prompt but not the seed: they differ; other seeds give other tokens.
    assert len({tuple(full.output_ids[i]) for i in range(3)}) > 1
    other = backend.generate(prompts, row_seeds=[s + 1 for s in seeds], **kw)
    assert other.output_ids != full.output_ids
    # A shared generator (the old way) does not have this property.
    g1 = backend.generate(prompts, seed=0, **kw).output_ids
    g2 = backend.generate([prompts[i] for i in order], seed=0, **kw).output_ids
    assert [g2[j] for j in range(len(order))] != [g1[i] for i in order]


def test_hf_row_seeds_errors_and_greedy(model, tok):
    backend = HFGenerationBackend(model, tok)
    prompts = _prompts(3, seed=4)
    with pytest.raises(ValueError, match="3 prompts"):
        backend.generate(prompts, max_new_tokens=2, row_seeds=[1, 2])
    greedy = backend.generate(prompts, max_new_tokens=4, greedy=True, row_seeds=[1, 2, 3]).output_ids
    assert greedy == backend.generate(prompts, max_new_tokens=4, greedy=True).output_ids
