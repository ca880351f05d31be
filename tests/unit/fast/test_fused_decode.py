"""The fused Llama decode forward (rlplane.fast.fused_decode) against its plain twin, the model's own
forward in the same ``hf`` loop: the same tokens and logprobs (fp32: to 1e-4; bf16: the same greedy
tokens on a SmolLM2-shaped model, logprobs within a bound), through left-padded prompts of different
lengths, shared prefill, row compaction, row seeds; proof that the fused path is the one that ran;
its switches; and no process-wide thread setting inside its forward."""

import copy

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rlplane.fast import switches
from rlplane.fast.fused_decode import output_linear, unsupported_reason
from rlplane.generation import HFGenerationBackend
from rlplane.models import build_char_tokenizer, build_tiny_llama
from rlplane.models.precision import autocast, set_precision


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _scaled(model, factor):
    # Random init (std 0.02) gives a near-constant function; scaled-up weights give varied continuations.
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(factor if p.dim() > 1 else 1)
    return model.eval()


def _tiny(tok, seed=0):
    return _scaled(build_tiny_llama(tok, hidden_size=32, num_layers=2, num_heads=2, seed=seed), 12)


def _smollm2_shaped(tok, seed=0, cls=LlamaForCausalLM, config_cls=LlamaConfig):
    """SmolLM2-135M's layer shapes (hidden 576, 9 query / 3 key-value heads of 64, MLP 1536, rope 1e5,
    tied embeddings), two layers and the char vocabulary."""
    config = config_cls(vocab_size=len(tok), hidden_size=576, intermediate_size=1536, num_hidden_layers=2,
                        num_attention_heads=9, num_key_value_heads=3, rms_norm_eps=1e-5, rope_theta=100000.0,
                        tie_word_embeddings=True, pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    return _scaled(model, 3)


def _prompts(n, seed=0, min_len=1, max_len=12):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g).tolist()
    return [[1] + torch.randint(4, 21, (k - 1,), generator=g).tolist() for k in lengths]


def _both(model, tok, prompts, **kwargs):
    fused = HFGenerationBackend(model, tok)
    out = fused.generate(prompts, **kwargs)
    assert fused.last_decode == "fused"
    ref = HFGenerationBackend(model, tok, decode="hf")
    expected = ref.generate(prompts, **kwargs)
    assert ref.last_decode == "hf"
    return out, expected


@pytest.mark.parametrize("sampling", [
    dict(greedy=True),
    dict(seed=5, temperature=0.8, top_k=9, top_p=0.9),
    dict(row_seeds=list(range(100, 118))),
])
@pytest.mark.parametrize("layout", ["grouped", "interleaved"])
def test_fp32_fused_equals_hf_forward(tok, sampling, layout):
    # Distinct prompts of 1..12 tokens (left padding), each three times (shared prefill), a stop token
    # that ends rows at different steps (compaction drops them). "grouped": each prompt's rows in a
    # row, which share one prompt cache; "interleaved": a, b, c, a, b, c, ..., copied out per row.
    distinct = _prompts(6, seed=9)
    prompts = [p for p in distinct for _ in range(3)] if layout == "grouped" else distinct * 3
    out, expected = _both(_tiny(tok), tok, prompts, max_new_tokens=10, stop_token_ids=[7], **sampling)
    assert out.output_ids == expected.output_ids and out.finish_reasons == expected.finish_reasons
    assert len({len(o) for o in out.output_ids}) > 1  # rows did stop at different steps
    for a, b in zip(out.logprobs, expected.logprobs):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


def test_fp32_qwen2_with_qkv_biases_equals_hf_forward(tok):
    # Qwen2 adds biases to q/k/v: the fused QKV matmul carries their concatenation.
    model = _smollm2_shaped(tok, cls=Qwen2ForCausalLM, config_cls=Qwen2Config)
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    prompts = [p for p in _prompts(4, seed=3) for _ in range(2)]
    out, expected = _both(model, tok, prompts, max_new_tokens=8, stop_token_ids=[], seed=1)
    assert out.output_ids == expected.output_ids
    for a, b in zip(out.logprobs, expected.logprobs):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


def test_bf16_fused_gives_the_greedy_tokens_of_the_hf_forward(tok):
    # Both paths run the same bf16 matmuls with fp32 residual, norms, rotary, softmax and lm_head;
    # they differ in summation order (fused QKV / gate-up matmuls) and in attention (SDPA's kernel
    # vs two matmuls), i.e. by bf16 roundings (2^-8 relative) that reach the logits through two
    # layers: measured max |logprob difference| 0.015-0.027 over 10 seeds of this test. So greedy
    # tokens agree except where two tokens are within that noise (a near-tie; the 21-token vocabulary
    # has many): each row's tokens must equal the HF path's up to its first near-tie, where the HF
    # path's top-2 logprob gap is below NEAR_TIE, and the logprobs up to there within BOUND.
    BOUND, NEAR_TIE = 0.05, 0.06  # twice the largest difference measured
    model = _smollm2_shaped(tok)
    set_precision(model, "bf16")
    prompts = [p for p in _prompts(8, seed=4) for _ in range(2)]
    out, expected = _both(model, tok, prompts, max_new_tokens=12, greedy=True, stop_token_ids=[])
    assert len({t for o in out.output_ids for t in o}) >= 5  # varied tokens, not one repeated
    whole_rows = 0
    for prompt, got, want, got_lp, want_lp in zip(prompts, out.output_ids, expected.output_ids, out.logprobs,
                                                  expected.logprobs):
        n = next((j for j, (x, y) in enumerate(zip(got, want)) if x != y), len(want))
        whole_rows += n == len(want)
        if n < len(want):
            with torch.no_grad(), autocast(model):  # the HF path's distribution at the flipped token
                logits = model(torch.tensor([prompt + want[: n + 1]])).logits[0, -2].float()
            top2 = logits.log_softmax(-1).topk(2).values
            assert float(top2[0] - top2[1]) < NEAR_TIE, (prompt, n)
        assert n == 0 or float((got_lp[:n] - want_lp[:n]).abs().max()) <= BOUND
    assert whole_rows >= len(prompts) // 2  # the flips are rare, not the rule


def test_the_fused_path_runs_without_the_model_forward(tok):
    # Would fail if generate() silently fell back on the model's forward.
    model = _tiny(tok)
    prompts = _prompts(4, seed=1)
    expected = HFGenerationBackend(model, tok).generate(prompts, max_new_tokens=5, seed=0)

    def forbidden(*args, **kwargs):
        raise AssertionError("the model's own forward ran")

    model.forward = forbidden
    backend = HFGenerationBackend(model, tok)
    out = backend.generate(prompts, max_new_tokens=5, seed=0)
    assert backend.last_decode == "fused" and out.output_ids == expected.output_ids
    with pytest.raises(AssertionError, match="own forward ran"):
        HFGenerationBackend(model, tok, decode="hf").generate(prompts, max_new_tokens=5, seed=0)


def test_other_models_keep_their_own_forward(tok):
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2)).eval()
    assert "model_type 'gpt2'" in unsupported_reason(gpt2)
    backend = HFGenerationBackend(gpt2, tok)
    backend.generate([[1, 5, 6]], max_new_tokens=3, seed=0)
    assert backend.last_decode == "hf"
    with pytest.raises(ValueError, match="decode = 'fused': model_type 'gpt2'"):
        HFGenerationBackend(gpt2, tok, decode="fused").generate([[1, 5, 6]], max_new_tokens=3)
    # A wrapped projection (a LoRA layer, say) is not read as a plain weight.
    wrapped = copy.deepcopy(_tiny(tok))
    wrapped.model.layers[1].mlp.up_proj = torch.nn.Sequential(wrapped.model.layers[1].mlp.up_proj)
    assert unsupported_reason(wrapped) == "layer 1 up_proj is Sequential, not a plain Linear"
    with pytest.raises(ValueError, match="decode = 'bogus'"):
        HFGenerationBackend(gpt2, tok, decode="bogus")


def test_grouped_rows_share_one_prompt_cache(tok):
    # GRPO's layout (each prompt's G rows in a row) keeps one prompt cache row per prompt; any other
    # expansion, and any compaction, copies it out per row.
    from rlplane.fast.fused_decode import LlamaDecoder

    model = _tiny(tok)
    ids = torch.tensor([[0, 1, 5], [1, 6, 7]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        decoder = LlamaDecoder(model, capacity=8)
        decoder.prefill(ids, mask, positions)
        decoder.expand(torch.tensor([0, 0, 0, 1, 1, 1]))
        assert decoder.group_size == 3 and decoder.prompt_keys.shape[1] == 2 and decoder.keys.shape[1] == 6
        decoder.select(torch.tensor([1, 4, 5]))
        assert decoder.group_size == 1 and decoder.prompt_keys.shape[1] == 3
        decoder.prefill(ids, mask, positions)
        decoder.expand(torch.tensor([0, 1, 0, 1]))
        assert decoder.group_size == 1 and decoder.prompt_keys.shape[1] == 4


@pytest.mark.parametrize("switch", [switches.FUSED_DECODE, switches.ALL])
def test_switch_sends_auto_to_the_models_own_forward(tok, monkeypatch, switch):
    model = _tiny(tok)
    prompts = _prompts(4, seed=2)
    fused = HFGenerationBackend(model, tok)
    expected = fused.generate(prompts, max_new_tokens=5, seed=0)
    monkeypatch.setenv(switch, "0")
    plain = HFGenerationBackend(model, tok)
    out = plain.generate(prompts, max_new_tokens=5, seed=0)
    assert (fused.last_decode, plain.last_decode) == ("fused", "hf")
    assert out.output_ids == expected.output_ids
    forced = HFGenerationBackend(model, tok, decode="fused")  # an explicit request still runs it
    forced.generate(prompts, max_new_tokens=2, seed=0)
    assert forced.last_decode == "fused"


def test_onednn_output_projection_equals_f_linear(monkeypatch):
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(64, 576, generator=g), torch.randn(1000, 576, generator=g), torch.randn(1000, generator=g)
    fast = output_linear(x, w, b)
    torch.testing.assert_close(fast, torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-4)
    monkeypatch.setenv(switches.ONEDNN_LINEAR, "0")
    assert torch.equal(output_linear(x, w, b), torch.nn.functional.linear(x, w, b))  # the plain twin


def test_forward_sets_no_thread_count(tok, monkeypatch):
    # torch.set_num_threads is process-wide: the async collector's generation runs beside the trainer.
    def forbidden(n):
        raise AssertionError(f"set_num_threads({n}) inside generate")

    monkeypatch.setattr(torch, "set_num_threads", forbidden)
    backend = HFGenerationBackend(_tiny(tok), tok)
    backend.generate(_prompts(4, seed=1), max_new_tokens=4, seed=0)
    assert backend.last_decode == "fused"
