"""The fused Gemma 3 decode forward against transformers' ``Gemma3ForCausalLM``: logits of prefill and of
every decode step equal a full HF forward over the same left-padded sequences (fp32, to 1e-4), through
sliding-window layers shorter than the sequences, query/key norms, soft-capped logits; and in the ``hf``
loop the same greedy tokens and sampled tokens as the model's own forward."""

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from rlplane.fast.fused_decode import unsupported_reason
from rlplane.fast.gemma_decode import Gemma3Decoder
from rlplane.generation import HFGenerationBackend
from rlplane.models import build_char_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _gemma(tok, seed=0, window=4, softcap=30.0):
    """Gemma 3 270M's layout at toy size: 4 query heads over 1 key/value head, head_dim != hidden / heads,
    sliding-window layers around one global one, tied embeddings scaled by sqrt(hidden)."""
    config = Gemma3TextConfig(vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=3,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
                              sliding_window=window, max_position_embeddings=128, final_logit_softcapping=softcap,
                              layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                              pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                              bos_token_id=tok.bos_token_id)
    config._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Gemma3ForCausalLM(config)
        with torch.no_grad():  # random norms (Gemma's init is all zeros) and larger weights: varied outputs
            for name, p in model.named_parameters():
                p.copy_(torch.randn_like(p) * 0.3 if "norm" in name else p * (1 if p.dim() < 2 else 8))
    return model.eval()


def _padded(prompts, pad):
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def _prompts(n, seed=0, max_len=9):
    g = torch.Generator().manual_seed(seed)
    return [[1] + torch.randint(4, 21, (int(k),), generator=g).tolist()
            for k in torch.randint(0, max_len, (n,), generator=g)]


@pytest.mark.parametrize("softcap", [None, 5.0])
def test_logits_equal_the_hf_forward_at_every_position(tok, softcap):
    model = _gemma(tok, softcap=softcap)
    assert unsupported_reason(model) is None
    prompts = _prompts(5)
    ids, mask = _padded(prompts, tok.pad_token_id)
    steps = 9  # prompt + generated run past the window of 4
    follow = torch.randint(4, 21, (len(prompts), steps), generator=torch.Generator().manual_seed(3))
    full_ids = torch.cat([ids, follow], 1)
    full_mask = torch.cat([mask, torch.ones_like(follow)], 1)
    full_pos = (full_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        expected = model(input_ids=full_ids, attention_mask=full_mask, position_ids=full_pos).logits
        dec = Gemma3Decoder(model, capacity=full_ids.shape[1])
        p = ids.shape[1]
        got = [dec.prefill(ids, mask, full_pos[:, :p])]
        dec.expand(torch.arange(len(prompts)))
        for s in range(steps - 1):
            got.append(dec.decode(follow[:, s], full_pos[:, p + s]))
    got = torch.stack(got, 1)  # (U, steps, V): the logits after the last prompt token and each followed one
    want = expected[:, p - 1: p - 1 + steps]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    if softcap is not None:
        assert want.abs().max() <= softcap


@pytest.mark.parametrize("sampling", [dict(greedy=True), dict(seed=4, temperature=1.0)])
def test_hf_loop_tokens_equal_the_models_own_forward(tok, sampling):
    model = _gemma(tok, seed=1)
    distinct = _prompts(4, seed=7)
    prompts = [p for p in distinct for _ in range(3)]  # grouped rows: one prompt cache per prompt
    fused = HFGenerationBackend(model, tok)
    out = fused.generate(prompts, max_new_tokens=12, stop_token_ids=[7], **sampling)
    assert fused.last_decode == "fused"
    ref = HFGenerationBackend(model, tok, decode="hf")
    expected = ref.generate(prompts, max_new_tokens=12, stop_token_ids=[7], **sampling)
    assert out.output_ids == expected.output_ids
    for a, b in zip(out.logprobs, expected.logprobs):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_bidirectional_gemma_stays_on_the_hf_forward(tok):
    model = _gemma(tok)
    model.config.use_bidirectional_attention = True
    assert unsupported_reason(model) == "bidirectional attention"
