"""The static-shape decoder (rlplane.fast.graph_decode) against its plain twin, the fused decoder, in the same
``hf`` loop. On a CPU its step runs eagerly (``decode="graph"`` -> ``graph-eager``): batch buckets with padding
rows, the static cache, the mask, the rotary table, row compaction across buckets, the cache kept and grown
between generations and the weights copied in at every one give the fused decoder's tokens and logprobs (fp32:
to 1e-5) for the same seeds. Capture is CUDA-only: its guard is tested here, the capture itself by the tests
at the end, which run only where a GPU is visible."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rlplane.fast import switches
from rlplane.fast.fused_decode import LlamaDecoder
from rlplane.fast.graph_decode import (
    StaticDecoder,
    batch_bucket,
    capacity_block,
    capture_unavailable,
    graph_unsupported_reason,
)
from rlplane.generation import HFGenerationBackend
from rlplane.models import build_char_tokenizer, build_tiny_llama
from rlplane.models.precision import autocast, set_precision

CUDA = torch.cuda.is_available()


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
    """SmolLM2-135M's layer shapes (9 query / 3 key-value heads of 64, MLP 1536), two layers, the char vocabulary."""
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


def _assert_same(out, expected, atol=1e-5):
    assert out.output_ids == expected.output_ids and out.finish_reasons == expected.finish_reasons
    for a, b in zip(out.logprobs, expected.logprobs):
        torch.testing.assert_close(a, b, atol=atol, rtol=0)


def test_batch_buckets_and_capacity_blocks():
    # Powers of two up to 256, then multiples of 256; capacity rounded up to a multiple of 64.
    assert [batch_bucket(n) for n in (1, 2, 3, 5, 8, 9, 64, 65, 200, 256)] == [1, 2, 4, 8, 8, 16, 64, 128, 256, 256]
    assert [batch_bucket(n) for n in (257, 512, 513, 1000)] == [512, 512, 768, 1024]
    assert [capacity_block(n) for n in (1, 64, 65, 130)] == [64, 64, 128, 192]
    with pytest.raises(ValueError, match="at least one"):
        batch_bucket(0)


@pytest.mark.parametrize("sampling", [
    dict(greedy=True),
    dict(seed=5, temperature=0.8, top_k=9, top_p=0.9),
    dict(row_seeds=list(range(100, 118))),
])
@pytest.mark.parametrize("layout", ["grouped", "interleaved"])
def test_fp32_static_step_equals_the_fused_decoder(tok, monkeypatch, sampling, layout):
    # 18 rows (bucket 32: 14 padding rows) from 6 prompts of 1..12 tokens (left padding, shared prefill), stop
    # tokens that end rows at different steps: compaction (before the first decode step too) moves the running
    # rows down and into smaller buckets, down to 1 row in some cases.
    distinct = _prompts(6, seed=9)
    prompts = [p for p in distinct for _ in range(3)] if layout == "grouped" else distinct * 3
    model = _tiny(tok)
    steps = []
    real = StaticDecoder._step
    monkeypatch.setattr(StaticDecoder, "_step", lambda self, b, k: steps.append((b, self.rows)) or real(self, b, k))
    static = HFGenerationBackend(model, tok, decode="graph")
    out = static.generate(prompts, max_new_tokens=10, stop_token_ids=[7, 12], **sampling)
    fused = HFGenerationBackend(model, tok, decode="fused")
    expected = fused.generate(prompts, max_new_tokens=10, stop_token_ids=[7, 12], **sampling)
    assert (static.last_decode, fused.last_decode) == ("graph-eager", "fused")
    _assert_same(out, expected)
    assert len({len(o) for o in out.output_ids}) > 1  # rows did stop at different steps
    assert all(b == batch_bucket(r) and b > r // 2 for b, r in steps)
    assert len({b for b, _ in steps}) > 1  # compaction crossed into a smaller bucket


@pytest.mark.parametrize("cls, config_cls", [(LlamaForCausalLM, LlamaConfig), (Qwen2ForCausalLM, Qwen2Config)])
def test_fp32_smollm2_shaped_grouped_query_attention(tok, cls, config_cls):
    # 9 query heads over 3 key-value heads of 64; Qwen2 adds q/k/v biases (carried by the fused QKV matrix).
    model = _smollm2_shaped(tok, cls=cls, config_cls=config_cls)
    if cls is Qwen2ForCausalLM:
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    prompts = [p for p in _prompts(4, seed=3) for _ in range(3)]
    kwargs = dict(max_new_tokens=8, stop_token_ids=[], row_seeds=list(range(12)))
    out = HFGenerationBackend(model, tok, decode="graph").generate(prompts, **kwargs)
    _assert_same(out, HFGenerationBackend(model, tok, decode="fused").generate(prompts, **kwargs))


def _assert_greedy_up_to_near_ties(model, prompts, out, expected, bound=0.06, near_tie=0.06):
    """Each row's tokens equal ``expected``'s up to its first near-tie (the model's top-2 logprob gap below
    ``near_tie`` at the flipped token), logprobs up to there within ``bound``; at least half the rows whole."""
    whole_rows = 0
    for prompt, got, want, got_lp, want_lp in zip(prompts, out.output_ids, expected.output_ids, out.logprobs,
                                                  expected.logprobs):
        n = next((j for j, (x, y) in enumerate(zip(got, want)) if x != y), len(want))
        whole_rows += n == len(want)
        if n < len(want):
            with torch.no_grad(), autocast(model):  # the distribution at the flipped token
                ids = torch.tensor([prompt + want[: n + 1]], device=model.device)
                logits = model(ids).logits[0, -2].float()
            top2 = logits.log_softmax(-1).topk(2).values
            assert float(top2[0] - top2[1]) < near_tie, (prompt, n)
        assert n == 0 or float((got_lp[:n] - want_lp[:n]).abs().max()) <= bound
    assert whole_rows >= len(prompts) // 2  # the flips are rare, not the rule


def test_bf16_static_step_gives_the_fused_decoders_greedy_tokens(tok):
    # Under bf16 autocast both run the same bf16 matmuls; attention differs (SDPA over bf16 keys/values here, fp32
    # matmuls over the same values there), i.e. by bf16 roundings: measured max |logprob difference| 0.019-0.029
    # over 6 seeds of this test, 12-16 of 16 rows identical, top-2 gaps at the flips 0.007-0.032. Bounds: twice that.
    model = _smollm2_shaped(tok)
    set_precision(model, "bf16")
    prompts = [p for p in _prompts(8, seed=4) for _ in range(2)]
    kwargs = dict(max_new_tokens=12, greedy=True, stop_token_ids=[])
    out = HFGenerationBackend(model, tok, decode="graph").generate(prompts, **kwargs)
    expected = HFGenerationBackend(model, tok, decode="fused").generate(prompts, **kwargs)
    assert len({t for o in out.output_ids for t in o}) >= 5  # varied tokens, not one repeated
    _assert_greedy_up_to_near_ties(model, prompts, out, expected)


def test_cache_kept_and_grown_between_generations(tok):
    model = _tiny(tok)
    static, fused = HFGenerationBackend(model, tok, decode="graph"), HFGenerationBackend(model, tok, decode="fused")
    calls = [(_prompts(3, seed=1), 6), (_prompts(40, seed=2), 6), (_prompts(5, seed=3, max_len=40), 60),
             (_prompts(2, seed=4), 4)]
    shapes = []
    for prompts, new in calls:
        kwargs = dict(max_new_tokens=new, stop_token_ids=[], row_seeds=list(range(len(prompts))))
        _assert_same(static.generate(prompts, **kwargs), fused.generate(prompts, **kwargs))
        shapes.append((static._static.cache_k.shape[1], static._static.cache_k.shape[3], static._static.cache_k))
    # rows: bucket 4, then 64 (grown), kept; slots: 64, then 128 for 40 + 60 positions (grown), kept after.
    assert [s[:2] for s in shapes] == [(4, 64), (64, 64), (64, 128), (64, 128)]
    assert shapes[3][2] is shapes[2][2]  # a smaller generation reuses the cache


@pytest.mark.parametrize("how", ["in_place", "replaced", "sleep"])
def test_weight_changes_between_generations_reach_the_kept_decoder(tok, how):
    # A refit copies into the parameters (load_state_dict), or parameters get new storage (p.data = ..., as
    # sleep/wake does): either way the next generation decodes with the new weights, while the decoder's own
    # buffers keep their addresses (a captured graph stays valid) unless it was dropped by sleep.
    model, new = _tiny(tok, seed=0), _tiny(tok, seed=1)
    prompts = [p for p in _prompts(4, seed=5) for _ in range(2)]
    kwargs = dict(max_new_tokens=8, stop_token_ids=[], row_seeds=list(range(8)))
    static = HFGenerationBackend(model, tok, decode="graph")
    before = static.generate(prompts, **kwargs)
    owned = {k: v.data_ptr() for k, v in static._static._owned.items()}
    if how == "in_place":
        static.update_weights(new.state_dict())
    elif how == "replaced":
        with torch.no_grad():
            for p, q in zip(model.parameters(), new.parameters()):
                p.data = q.detach().clone()
    else:
        static.sleep()
        assert static._static is None
        static.update_weights(new.state_dict())
    after = static.generate(prompts, **kwargs)
    _assert_same(after, HFGenerationBackend(new, tok, decode="fused").generate(prompts, **kwargs))
    assert after.output_ids != before.output_ids
    if how != "sleep":
        assert {k: v.data_ptr() for k, v in static._static._owned.items()} == owned


def test_the_step_never_synchronises_with_the_host(tok, monkeypatch):
    # A CUDA graph cannot hold a device-to-host read: any .item(), bool(), .tolist(), .cpu() or nonzero inside
    # the step would break its capture. Each raises here while the step runs.
    model = _smollm2_shaped(tok)
    inside = {"step": False}
    real = StaticDecoder._step

    def step(self, bucket, block):
        inside["step"] = True
        try:
            return real(self, bucket, block)
        finally:
            inside["step"] = False

    monkeypatch.setattr(StaticDecoder, "_step", step)
    for name in ("item", "__bool__", "tolist", "cpu", "nonzero", "numpy", "__int__", "__float__"):
        original = getattr(torch.Tensor, name)

        def guarded(self, *args, _name=name, _original=original, **kwargs):
            assert not inside["step"], f"Tensor.{_name} inside the decode step"
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, guarded)
    backend = HFGenerationBackend(model, tok, decode="graph")
    out = backend.generate(_prompts(5, seed=6), max_new_tokens=6, stop_token_ids=[], seed=0)
    assert backend.last_decode == "graph-eager" and all(len(o) == 6 for o in out.output_ids)


def test_capture_is_guarded_off_cuda(tok):
    model = _tiny(tok)
    assert capture_unavailable("cpu") == "the model is on cpu; CUDA graphs need a CUDA device"
    if not CUDA:
        assert capture_unavailable("cuda") == "this process sees no CUDA device"
    with pytest.raises(ValueError, match=r"capture=True\): the model is on cpu; CUDA graphs need a CUDA device"):
        StaticDecoder(model, capture=True)


def test_auto_picks_the_captured_decoder_only_on_cuda(tok, monkeypatch):
    # On a CPU `auto` keeps the fused decoder. For a model that says it is on CUDA the backend's choice of decoder
    # asks for the captured one: here its guard refuses (the weights are on the CPU), which shows the choice; the
    # switches send it back to the fused decoder (RLPLANE_CUDA_GRAPH_DECODE=0) or the model's own forward
    # (RLPLANE_FUSED_DECODE=0, RLPLANE_FAST=0).
    model = _tiny(tok)
    backend = HFGenerationBackend(model, tok)
    backend.generate(_prompts(3, seed=7), max_new_tokens=3, seed=0)
    assert backend.last_decode == "fused"
    monkeypatch.setattr(type(model), "device", property(lambda self: torch.device("cuda")))
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        backend._stepper(capacity=16)
    for switch, decode in ((switches.CUDA_GRAPH_DECODE, "fused"), (switches.FUSED_DECODE, "hf"), (switches.ALL, "hf")):
        monkeypatch.setenv(switch, "0")
        backend._stepper(capacity=16)
        assert backend.last_decode == decode, switch
        monkeypatch.delenv(switch)


def test_unsupported_models_and_options(tok):
    gemma_like = _tiny(tok)
    gemma_like.model.embed_tokens = torch.nn.Sequential(gemma_like.model.embed_tokens)
    assert graph_unsupported_reason(gemma_like) == "embedding is Sequential, not a plain Embedding"
    with pytest.raises(ValueError, match="decode = 'graph': embedding is Sequential"):
        HFGenerationBackend(gemma_like, tok, decode="graph").generate([[1, 5]], max_new_tokens=2)
    with pytest.raises(ValueError, match="decode = 'graph' has its own preallocated cache"):
        HFGenerationBackend(_tiny(tok), tok, decode="graph", kv_cache="dynamic")


def _teacher_forced(decoder, device, steps=10):
    """Logits of a prefill and ``steps`` decode steps over fixed tokens: 6 left-padded prompts x 3 rows (bucket
    32), every other row dropped after step 4 (9 rows: bucket 16)."""
    prompts = _prompts(6, seed=8)
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)  # 0: padding only
    mask = (ids != 0).long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    rows = torch.arange(6, device=device).repeat_interleave(3)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, 21, (steps, 18), generator=g).to(device)
    out = []
    with torch.no_grad():
        if isinstance(decoder, StaticDecoder):
            decoder.begin(width + steps + 1)
        out.append(decoder.prefill(ids, mask, positions))
        decoder.expand(rows)
        pos = positions[rows, -1] + 1
        for k in range(steps):
            if k == 4:
                keep = torch.arange(0, 18, 2, device=device)
                decoder.select(keep)
                tokens, pos = tokens[:, keep], pos[keep]
            out.append(decoder.decode(tokens[k], pos).clone())
            pos = pos + 1
    return out


def test_step_logits_equal_the_fused_decoders_step_by_step(tok):
    # Without sampling in between: the same fixed tokens through both decoders, each step's logits (fp32).
    model = _smollm2_shaped(tok)
    got = _teacher_forced(StaticDecoder(model, capture=False), "cpu")
    want = _teacher_forced(LlamaDecoder(model, capacity=64), "cpu")
    assert [a.shape[0] for a in got] == [6] + [18] * 4 + [9] * 6
    for a, b in zip(got, want):  # logits up to ~5 in size; measured max difference 6e-6
        torch.testing.assert_close(a, b, atol=2e-5, rtol=0)


# ---- CUDA only: capture and replay (skipped where no GPU is visible)
cuda_only = pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")


@cuda_only
def test_cuda_replayed_graphs_give_the_eager_steps_logits(tok):
    # The same kernels replayed: the logits of the uncaptured step on the same GPU, step by step, across a
    # compaction into a smaller bucket; one capture per (bucket, block), none again for a second generation.
    model = _smollm2_shaped(tok).cuda()
    graph, eager = StaticDecoder(model, capture=True), StaticDecoder(model, capture=False)
    got, want = _teacher_forced(graph, "cuda"), _teacher_forced(eager, "cuda")
    assert graph.captures == 2  # buckets 32 and 16
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    again = _teacher_forced(graph, "cuda")
    assert graph.captures == 2
    for a, b in zip(again, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


@cuda_only
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cuda_graph_generation_matches_the_fused_decoder(tok, precision):
    model = _smollm2_shaped(tok).cuda()
    set_precision(model, precision)
    prompts = [p for p in _prompts(6, seed=8) for _ in range(3)]
    kwargs = dict(max_new_tokens=10, stop_token_ids=[7], row_seeds=list(range(18)))
    graph = HFGenerationBackend(model, tok)  # auto on CUDA
    out = graph.generate(prompts, **kwargs)
    assert graph.last_decode == "graph"
    expected = HFGenerationBackend(model, tok, decode="fused").generate(prompts, **kwargs)
    if precision == "fp32":
        _assert_same(out, expected, atol=1e-4)
    else:  # bf16 roundings: a near-tie may flip a row (greedy, so a flip is a near-tie of the model's own)
        kwargs = dict(max_new_tokens=10, greedy=True, stop_token_ids=[])
        out = graph.generate(prompts, **kwargs)
        expected = HFGenerationBackend(model, tok, decode="fused").generate(prompts, **kwargs)
        _assert_greedy_up_to_near_ties(model, prompts, out, expected)


@cuda_only
def test_cuda_graphs_see_weights_refit_in_place_and_after_sleep(tok):
    model, new = _tiny(tok, seed=0).cuda(), _tiny(tok, seed=1).cuda()
    prompts = [p for p in _prompts(4, seed=5) for _ in range(2)]
    kwargs = dict(max_new_tokens=8, stop_token_ids=[], row_seeds=list(range(8)))
    expected = HFGenerationBackend(new, tok, decode="fused").generate(prompts, **kwargs)
    graph = HFGenerationBackend(model, tok, decode="graph")
    graph.generate(prompts, **kwargs)
    captures = graph._static.captures
    graph.update_weights(new.state_dict())
    _assert_same(graph.generate(prompts, **kwargs), expected, atol=1e-4)
    assert graph._static.captures == captures  # the same graphs, reading the refreshed buffers
    graph.sleep()
    graph.update_weights(new.state_dict())
    _assert_same(graph.generate(prompts, **kwargs), expected, atol=1e-4)
    assert graph._static.captures >= 1  # captured again after the wake
