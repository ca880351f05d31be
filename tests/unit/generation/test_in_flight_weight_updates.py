"""In-flight weight updates in the hf decode loop: a refit from another thread lands at the next
token boundary, the recorded per-token versions flip exactly there, and each token's logprob is the
one of the weights that sampled it (the earlier positions' KV cache kept as the old weights made it)."""

import threading
import time

import pytest
import torch
from transformers import DynamicCache

from rlplane.generation import HFGenerationBackend, sampling_logprobs
from rlplane.generation.interface import WeightSwap
from rlplane.models import build_char_tokenizer, build_tiny_llama

PROMPT = [1, 7, 9, 4, 12]
NEW = 12
SWAP_AT = 5  # the first token sampled with the new weights


def _model(tok, seed):
    model = build_tiny_llama(tok, hidden_size=32, num_layers=2, num_heads=2, seed=seed).eval()
    with torch.no_grad():  # scaled up: varied, weight-dependent continuations (as in test_hf_generation)
        for p in model.parameters():
            p.mul_(12 if p.dim() > 1 else 1)
    return model


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _generate_with_swap(tok, old, new, swap_at, decode="auto"):
    """Generate NEW tokens from ``old`` weights; a second thread refits to ``new`` (version 1) while
    the loop runs, handed over just before the forward that computes token ``swap_at``'s logits."""
    backend = HFGenerationBackend(_model(tok, 0), tok, decode=decode)
    backend.update_weights(old.state_dict(), version=0)
    real_boundary = backend._swap.boundary
    calls = {"n": 0}
    updater: list[threading.Thread] = []

    def boundary():
        calls["n"] += 1  # call 1 precedes the prefill (token 0's logits); call k+1 precedes token k's
        if calls["n"] == swap_at + 1:
            t = threading.Thread(target=backend.update_weights, args=(new.state_dict(),), kwargs={"version": 1})
            t.start()
            updater.append(t)
            deadline = time.monotonic() + 10
            while backend._swap._pending is None:  # the refit is waiting on the loop, not applied yet
                assert time.monotonic() < deadline and t.is_alive()
                time.sleep(0.001)
        return real_boundary()

    backend._swap.boundary = boundary
    out = backend.generate([PROMPT], max_new_tokens=NEW, temperature=1.0, stop_token_ids=[], row_seeds=[123])
    updater[0].join(10)
    assert not updater[0].is_alive()  # the refit returned once the loop had loaded the weights
    return backend, out


# The fused Llama forward rebuilds its matrices at the swap; the static-shape one copies them into its buffers.
@pytest.mark.parametrize("decode", ["fused", "hf", "graph"])
def test_versions_flip_at_the_swap_and_logprobs_are_the_sampling_weights(tok, decode):
    old, new = _model(tok, 0), _model(tok, 1)
    backend, out = _generate_with_swap(tok, old, new, SWAP_AT, decode)
    assert backend.last_decode == {"graph": "graph-eager"}.get(decode, decode)
    ids, lps, versions = out.output_ids[0], out.logprobs[0], out.versions[0]
    assert len(ids) == NEW
    assert versions.tolist() == [0] * SWAP_AT + [1] * (NEW - SWAP_AT)
    assert backend.weight_version == 1
    for k, v in backend.model.state_dict().items():  # the generator holds the new weights now
        assert torch.equal(v, new.state_dict()[k]), k

    seq = torch.tensor([PROMPT + ids])
    P = len(PROMPT)
    with torch.no_grad():
        # Before the swap: a fresh forward of the old weights.
        logits_old = old(input_ids=seq).logits[0, P - 1 : P - 1 + NEW]  # row j predicts output token j
        expect_old = sampling_logprobs(logits_old, temperature=1.0, top_k=None, top_p=1.0,
                                       tokens=torch.tensor(ids))
        # After: the new weights, on top of the KV cache the old weights built for prompt + ids[:SWAP_AT-1]
        # (NeMo RL's default: the cache is not recomputed after an in-flight update).
        cache = DynamicCache(config=old.config)
        old(input_ids=seq[:, : P + SWAP_AT - 1], past_key_values=cache, use_cache=True)
        logits_new = new(input_ids=seq[:, P + SWAP_AT - 1 : P + NEW - 1], past_key_values=cache,
                         use_cache=True).logits[0]  # tokens SWAP_AT .. NEW-1
        expect_new = sampling_logprobs(logits_new, temperature=1.0, top_k=None, top_p=1.0,
                                       tokens=torch.tensor(ids[SWAP_AT:]))
    torch.testing.assert_close(lps[:SWAP_AT], expect_old[:SWAP_AT], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lps[SWAP_AT:], expect_new, atol=1e-5, rtol=1e-5)
    # The swap changed the distribution: the old weights give those tokens other logprobs.
    assert (lps[SWAP_AT:] - expect_old[SWAP_AT:]).abs().max() > 1e-2


def test_without_a_swap_every_token_has_the_loaded_version(tok):
    backend = HFGenerationBackend(_model(tok, 0), tok)
    out = backend.generate([PROMPT], max_new_tokens=4, stop_token_ids=[], row_seeds=[1])
    assert out.versions is None  # never given a version: the caller stamps its own
    backend.update_weights(_model(tok, 1).state_dict(), version=7)
    out = backend.generate([PROMPT, PROMPT[:2]], max_new_tokens=4, stop_token_ids=[], row_seeds=[1, 2])
    assert [v.tolist() for v in out.versions] == [[7] * 4, [7] * 4]


def test_weight_swap_outside_a_generation_loads_at_once_and_reports_a_failed_handover():
    loaded = []
    swap = WeightSwap(loaded.append)
    swap.update({"w": torch.ones(1)}, version=3)
    assert len(loaded) == 1 and swap.version == 3

    def bad(_):
        raise ValueError("shape mismatch")

    swap = WeightSwap(bad)
    errors = []
    with pytest.raises(ValueError), swap.generating():
        t = threading.Thread(target=lambda: errors.append(_catch(lambda: swap.update({}, version=1))))
        t.start()
        while swap._pending is None:
            time.sleep(0.001)
        swap.boundary()  # the generating thread's load fails: it raises here ...
    t.join(5)
    assert "loading in the generating thread failed" in errors[0]  # ... and the refit is told, not hung


def _catch(fn):
    try:
        fn()
    except RuntimeError as e:
        return str(e)
    return ""
