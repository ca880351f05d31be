"""The hf backend against transformers: same greedy tokens as model.generate, logprobs equal to a
plain full forward of prompt + output, stop tokens / strings, row compaction and prefix sharing."""

import pytest
import torch

from rlplane.generation import HFGenerationBackend, process_logits
from rlplane.models import build_char_tokenizer, build_tiny_llama

EOS = 2


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _model(tok, seed=0):
    model = build_tiny_llama(tok, hidden_size=32, num_layers=2, num_heads=2, seed=seed).eval()
    # Random init (std 0.02) makes a near-constant function; scaled-up weights give varied,
    # prompt-dependent continuations so that the equivalence tests below have teeth.
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(12 if p.dim() > 1 else 1)
    return model


@pytest.fixture(scope="module")
def model(tok):
    return _model(tok)


def _prompts(n, seed=0, min_len=2, max_len=9):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g).tolist()
    return [[1] + torch.randint(4, 21, (k - 1,), generator=g).tolist() for k in lengths]


def _hf_greedy(model, tok, prompts, max_new_tokens, eos):
    tok.padding_side = "left"
    enc = tok.pad({"input_ids": prompts}, return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=0)
    rows = []
    for row in out[:, enc["input_ids"].shape[1]:].tolist():
        rows.append(row[: row.index(eos) + 1] if eos is not None and eos in row else row)
    return rows


def _full_forward_logprobs(model, prompt, output, temperature, top_k=None, top_p=1.0):
    """log p(output_t | prompt, output_<t) from one plain forward of the unpadded sequence."""
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1]  # (T, V): the positions that predict output
    logprobs = process_logits(logits, temperature, top_k, top_p).log_softmax(-1)
    return logprobs.gather(-1, torch.tensor(output)[:, None]).squeeze(-1)


def test_greedy_equals_model_generate(model, tok):
    prompts = _prompts(24)
    ours = HFGenerationBackend(model, tok).generate(prompts, max_new_tokens=12, greedy=True, stop_token_ids=[])
    assert ours.output_ids == _hf_greedy(model, tok, prompts, 12, eos=None)
    assert len({tuple(o) for o in ours.output_ids}) > 5  # the model is not degenerate
    assert ours.finish_reasons == ["length"] * 24


def test_greedy_with_stop_token_equals_model_generate(model, tok):
    prompts = _prompts(32, seed=1)
    plain = HFGenerationBackend(model, tok).generate(prompts, max_new_tokens=10, greedy=True, stop_token_ids=[])
    # Pick as "eos" a token the model emits mid-way in some rows, so rows stop at different steps.
    counts = torch.bincount(torch.tensor([t for o in plain.output_ids for t in o[1:6]]), minlength=21)
    stop = int(counts.argmax())
    ours = HFGenerationBackend(model, tok).generate(prompts, max_new_tokens=10, greedy=True, stop_token_ids=[stop])
    assert ours.output_ids == _hf_greedy(model, tok, prompts, 10, eos=stop)
    lengths = {len(o) for o in ours.output_ids}
    assert len(lengths) > 1  # rows really stopped at different steps (exercises row compaction)
    for out, reason in zip(ours.output_ids, ours.finish_reasons):
        assert stop not in out[:-1]
        assert reason == ("stop" if out[-1] == stop else "length")
        assert reason == "stop" or len(out) == 10


@pytest.mark.parametrize("temperature, "
                         "top_k, top_p", [(1.0, None, 1.0), (0.7, None, 1.0), (1.3, 5, 1.0), (0.8, 0, 0.8)])
def test_logprobs_equal_full_forward(model, tok, temperature, top_k, top_p):
    prompts = _prompts(16, seed=2)
    out = HFGenerationBackend(model, tok).generate(
        prompts, max_new_tokens=8, temperature=temperature, top_k=top_k, top_p=top_p, seed=0
    )
    for prompt, ids, lp in zip(prompts, out.output_ids, out.logprobs):
        assert lp.shape == (len(ids),) and lp.dtype == torch.float32
        expected = _full_forward_logprobs(model, prompt, ids, temperature, top_k, top_p)
        torch.testing.assert_close(lp, expected, atol=1e-4, rtol=1e-4)


def test_seeded_sampling_is_reproducible(model, tok):
    backend = HFGenerationBackend(model, tok)
    prompts = _prompts(8, seed=3)
    a = backend.generate(prompts, max_new_tokens=6, seed=11)
    b = backend.generate(prompts, max_new_tokens=6, generator=torch.Generator().manual_seed(11))
    c = backend.generate(prompts, max_new_tokens=6, seed=12)
    assert a.output_ids == b.output_ids and a.output_ids != c.output_ids


def test_repeated_prompts_share_prefill(model, tok):
    # GRPO repeats each prompt G times: the deduplicated prefill must not change any row.
    prompts = _prompts(3, seed=4)
    backend = HFGenerationBackend(model, tok)
    repeated = [p for p in prompts for _ in range(4)]
    out = backend.generate(repeated, max_new_tokens=8, greedy=True, stop_token_ids=[])
    single = [backend.generate([p], max_new_tokens=8, greedy=True, stop_token_ids=[]).output_ids[0] for p in prompts]
    assert out.output_ids == [s for s in single for _ in range(4)]
    sampled = backend.generate(repeated, max_new_tokens=8, seed=0, stop_token_ids=[])
    for p, ids, lp in zip(repeated, sampled.output_ids, sampled.logprobs):
        torch.testing.assert_close(lp, _full_forward_logprobs(model, p, ids, 1.0), atol=1e-4, rtol=1e-4)


def test_rows_match_generating_each_alone(model, tok):
    # Left padding, row compaction and early stopping must not leak between rows.
    prompts = _prompts(12, seed=5, min_len=1, max_len=12)
    backend = HFGenerationBackend(model, tok)
    stop = [7, 9]
    batch = backend.generate(prompts, max_new_tokens=9, greedy=True, stop_token_ids=stop)
    alone = [backend.generate([p], max_new_tokens=9, greedy=True, stop_token_ids=stop).output_ids[0] for p in prompts]
    assert batch.output_ids == alone


def test_stop_strings(model, tok):
    prompts = _prompts(16, seed=6)
    backend = HFGenerationBackend(model, tok)
    plain = backend.generate(prompts, max_new_tokens=10, greedy=True, stop_token_ids=[])
    texts = [tok.decode(o) for o in plain.output_ids]
    # A two-character stop string (of one-character tokens) occurring after the start of an output.
    stop = next(t[i : i + 2] for t in texts for i in range(1, len(t) - 1)
                if "<" not in t[i : i + 2] and ">" not in t[i : i + 2])
    out = backend.generate(prompts, max_new_tokens=10, greedy=True, stop_token_ids=[], stop_strings=[stop])
    hits = 0
    for full, ids, reason in zip(texts, out.output_ids, out.finish_reasons):
        text = tok.decode(ids)
        if stop in full:
            hits += 1
            # Stops at the token that completes the stop string, that token included.
            assert reason == "stop" and stop in text and stop not in tok.decode(ids[:-1])
            assert full.startswith(text)
        else:
            assert reason == "length" and text == full
    assert hits >= 1
    # Per-row stop strings: only row 0 gets one.
    per_row = backend.generate(
        prompts, max_new_tokens=10, greedy=True, stop_token_ids=[], stop_strings=[[texts[0][:2]]] + [None] * 15
    )
    assert tok.decode(per_row.output_ids[0]) == texts[0][:2] and per_row.finish_reasons[0] == "stop"
    assert per_row.output_ids[1:] == plain.output_ids[1:]


def test_eos_default_from_tokenizer(model, tok):
    # With default stop ids the tokenizer's eos ends a row; eos is the row's last token.
    bias_model = _model(tok)
    with torch.no_grad():
        bias_model.model.embed_tokens.weight[EOS] *= 3  # tied: boosts eos logits
    out = HFGenerationBackend(bias_model, tok).generate(_prompts(16, seed=7), max_new_tokens=6, seed=0)
    stopped = [o for o, r in zip(out.output_ids, out.finish_reasons) if r == "stop"]
    assert stopped and all(o[-1] == EOS and EOS not in o[:-1] for o in stopped)


def test_update_weights_refits(tok):
    a, b = _model(tok, seed=0), _model(tok, seed=1)
    prompts = _prompts(8, seed=8)
    backend = HFGenerationBackend(a, tok)
    expected = HFGenerationBackend(b, tok).generate(prompts, max_new_tokens=6, greedy=True, stop_token_ids=[])
    assert backend.generate(prompts, max_new_tokens=6, greedy=True, stop_token_ids=[]).output_ids != expected.output_ids
    backend.update_weights(b.state_dict())
    assert backend.generate(prompts, max_new_tokens=6, greedy=True, stop_token_ids=[]).output_ids == expected.output_ids
    with pytest.raises(ValueError, match="unexpected"):
        backend.update_weights({"not.a.weight": torch.zeros(1)})


def test_input_errors(model, tok):
    backend = HFGenerationBackend(model, tok)
    assert backend.generate([], max_new_tokens=3).output_ids == []
    with pytest.raises(ValueError, match="at least one token"):
        backend.generate([[1], []], max_new_tokens=3)
    with pytest.raises(ValueError, match="per-row entries"):
        backend.generate([[1], [1]], max_new_tokens=3, stop_strings=[["1"]])


def test_shared_training_model_is_restored_and_not_modified(tok):
    model = _model(tok).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    HFGenerationBackend(model, tok).generate(_prompts(4), max_new_tokens=3, seed=0)
    assert model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    loss = model(torch.tensor([[1, 5, 6]])).logits.sum()  # still trainable after generation
    loss.backward()


def test_preallocated_cache_equals_dynamic_cache(model, tok):
    # Same tokens and logprobs as transformers' DynamicCache, through row compaction (a stop token
    # that ends rows at different steps) and the shared-prefill expansion (repeated prompts).
    prompts = [p for p in _prompts(6, seed=9, min_len=1, max_len=12) for _ in range(3)]
    kwargs = dict(max_new_tokens=10, stop_token_ids=[7], seed=5)
    fast = HFGenerationBackend(model, tok, decode="hf").generate(prompts, **kwargs)
    slow = HFGenerationBackend(model, tok, kv_cache="dynamic").generate(prompts, **kwargs)
    assert fast.output_ids == slow.output_ids and fast.finish_reasons == slow.finish_reasons
    assert len({len(o) for o in fast.output_ids}) > 1
    for a, b in zip(fast.logprobs, slow.logprobs):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="kv_cache"):
        HFGenerationBackend(model, tok, kv_cache="static")


def test_preallocated_cache_under_bf16_autocast_keeps_bf16_and_equals_dynamic_cache(tok):
    # Under bf16 autocast the buffer stores what attention would cast the keys to (bf16), once per
    # key: the generated tokens and logprobs must be exactly those of the fp32 DynamicCache that
    # attention casts at every step.
    import copy

    from rlplane.generation.kv_cache import PreallocatedLayer
    from rlplane.models.precision import set_precision

    layer = PreallocatedLayer(capacity=4)
    keys = torch.randn(2, 1, 3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        k, v = layer.update(keys, keys.bfloat16())
    assert k.dtype == v.dtype == torch.bfloat16 and torch.equal(k, keys.bfloat16())
    model = copy.deepcopy(_model(tok))
    set_precision(model, "bf16")
    prompts = [p for p in _prompts(4, seed=9, min_len=1, max_len=12) for _ in range(2)]
    kwargs = dict(max_new_tokens=10, stop_token_ids=[7], seed=5)
    fast = HFGenerationBackend(model, tok, decode="hf").generate(prompts, **kwargs)
    slow = HFGenerationBackend(model, tok, kv_cache="dynamic").generate(prompts, **kwargs)
    assert fast.output_ids == slow.output_ids
    assert all(torch.equal(a, b) for a, b in zip(fast.logprobs, slow.logprobs))


def test_frozen_weights_are_cast_once_per_call_under_bf16(tok):
    # Autocast re-casts a weight that does not require grad at every use (a LoRA base layer, a
    # reference copy): every weight at every decode step. generate() casts frozen linear weights once
    # per call, with the same values: identical tokens and logprobs to the trainable model, and no
    # parameter reaches aten._to_copy more than once. (Before: 2 layers x 7 linears, 9 steps -> each
    # weight cast 10 times, once per forward.)
    import copy
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    from rlplane.models.precision import set_precision

    trainable = copy.deepcopy(_model(tok))
    set_precision(trainable, "bf16")
    frozen = copy.deepcopy(trainable).requires_grad_(False)
    prompts = [p for p in _prompts(3, seed=2) for _ in range(2)]
    kwargs = dict(max_new_tokens=10, stop_token_ids=[], seed=1)
    expected = HFGenerationBackend(trainable, tok, decode="hf").generate(prompts, **kwargs)

    params = {p.data_ptr() for p in frozen.parameters()}
    casts = Counter()

    class CountCasts(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default and args[0].data_ptr() in params:
                casts[args[0].data_ptr()] += 1
            return func(*args, **(kwargs or {}))

    with CountCasts():
        out = HFGenerationBackend(frozen, tok, decode="hf").generate(prompts, **kwargs)
    assert out.output_ids == expected.output_ids
    # Same bf16 values in the same matmuls; without native bf16 (no avx512_bf16) oneDNN may pick another
    # kernel for a weight cast ahead than for one cast inside autocast, so allow last-bit rounding.
    assert max((a - b).abs().max().item() for a, b in zip(out.logprobs, expected.logprobs)) < 1e-2
    assert casts and max(casts.values()) == 1



def test_weights_loaded_inside_generate_refresh_the_frozen_casts(tok):
    # An in-flight weight update lands at a token boundary inside generate(), where the frozen
    # weights' bf16 copies are already made: they must follow the new weights, or the tokens after
    # the swap would be sampled with the old ones.
    import copy

    from rlplane.generation.hf import _frozen_weights_cast
    from rlplane.models.precision import autocast, set_precision

    frozen = copy.deepcopy(_model(tok))
    set_precision(frozen, "bf16")
    frozen.requires_grad_(False)
    backend = HFGenerationBackend(frozen, tok)
    new = {k: v + 0.5 if v.is_floating_point() else v for k, v in frozen.state_dict().items()}
    with torch.no_grad(), autocast(frozen):
        backend._cast_weights = _frozen_weights_cast(frozen)  # as generate() does
        assert backend._cast_weights
        backend._load_weights(new)
        for name, w in backend._cast_weights.items():
            assert torch.equal(w, new[name].to(w.dtype)), name
    backend._cast_weights = {}
    backend._load_weights(new)  # outside generate: nothing cast, nothing to refresh
    assert backend._cast_weights == {}

# ---- issue 16 item 13b: every eos of the generation config ends a row ------------------------------
def test_default_stop_token_ids_union_of_tokenizer_and_generation_config(tok):
    from rlplane.generation.interface import default_stop_token_ids

    model = _model(tok)
    model.generation_config.eos_token_id = [7, EOS, 9]
    assert default_stop_token_ids(model, tok) == [EOS, 7, 9]  # tokenizer's eos first, no repeats
    model.generation_config.eos_token_id = EOS
    assert default_stop_token_ids(model, tok) == [EOS]
    model.generation_config.eos_token_id = None
    assert default_stop_token_ids(model, tok) == [EOS]


def test_generation_config_eos_list_stops_rows(tok):
    """A chat model's end-of-turn token that is not the tokenizer's eos, listed in
    ``generation_config.eos_token_id``: rows end there (they ran to max_new_tokens before)."""
    model = _model(tok)
    prompts = _prompts(16, seed=4)
    plain = HFGenerationBackend(model, tok).generate(prompts, max_new_tokens=10, greedy=True, stop_token_ids=[])
    counts = torch.bincount(torch.tensor([t for o in plain.output_ids for t in o[1:]]), minlength=len(tok))
    counts[EOS] = 0
    end_of_turn = int(counts.argmax())  # a token the model emits mid-way in some rows
    model.generation_config.eos_token_id = [EOS, end_of_turn]
    out = HFGenerationBackend(model, tok).generate(prompts, max_new_tokens=10, greedy=True)
    explicit = HFGenerationBackend(model, tok).generate(
        prompts, max_new_tokens=10, greedy=True, stop_token_ids=[EOS, end_of_turn])
    assert out.output_ids == explicit.output_ids
    stopped = [o for o, r in zip(out.output_ids, out.finish_reasons) if r == "stop"]
    assert any(o[-1] == end_of_turn for o in stopped)
    assert all(end_of_turn not in o[:-1] for o in out.output_ids)
    # transformers' generate stops at the same list (cut each of its rows at its first stop token).
    theirs = _hf_greedy(model, tok, prompts, 10, eos=[EOS, end_of_turn])
    cut = [next((r[: k + 1] for k, t in enumerate(r) if t in (EOS, end_of_turn)), r) for r in theirs]
    assert out.output_ids == cut


# ---- issue 16 item 13c: stop strings that end in a space, or span tokens ---------------------------
def _metaspace_tokenizer():
    """A sentencepiece-style tokenizer: pieces ``▁x`` carry a leading space that decoding a piece on
    its own drops (``decode(["▁5"]) == "5"``), as Llama's and Mistral's tokenizers do."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list("0123456789+=")
    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>", *chars, *("\u2581" + c for c in chars)])}
    t = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    t.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    return PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", clean_up_tokenization_spaces=False)


def test_stop_string_ending_in_a_space():
    tok = _metaspace_tokenizer()
    assert tok.decode([tok.convert_tokens_to_ids("\u25815")]) == "5"  # the space is lost on its own
    model = _model(tok, seed=1)
    prompts = [[1] + torch.randint(4, 28, (4,), generator=torch.Generator().manual_seed(i)).tolist() for i in range(16)]
    backend = HFGenerationBackend(model, tok)
    plain = backend.generate(prompts, max_new_tokens=12, greedy=True, stop_token_ids=[])
    texts = [tok.decode(o) for o in plain.output_ids]
    # "<c> " where a space follows a character after the output's start: the space is the leading
    # "▁" of the next piece, so the stop string ends inside that piece.
    stop = next(t[i - 1 : i + 1] for t in texts for i in range(2, len(t)) if t[i] == " " and t[i - 1] != " ")
    out = backend.generate(prompts, max_new_tokens=12, greedy=True, stop_token_ids=[], stop_strings=[stop])
    hits = 0
    for full, ids, reason in zip(texts, out.output_ids, out.finish_reasons):
        text = tok.decode(ids)
        if stop in full:
            hits += 1
            assert reason == "stop" and stop in text and stop not in tok.decode(ids[:-1]), (stop, full, text)
        else:
            assert reason == "length" and text == full
    assert hits >= 1


def test_stop_string_spanning_tokens_with_a_trailing_space():
    # "<a><b> " spans three pieces ("a", "▁b" or "b", then the "▁" of the next piece).
    tok = _metaspace_tokenizer()
    model = _model(tok, seed=1)
    prompts = [[1] + torch.randint(4, 28, (4,), generator=torch.Generator().manual_seed(i)).tolist() for i in range(16)]
    backend = HFGenerationBackend(model, tok)
    plain = backend.generate(prompts, max_new_tokens=12, greedy=True, stop_token_ids=[])
    texts = [tok.decode(o) for o in plain.output_ids]
    stop = next(t[i - 3 : i + 1] for t in texts for i in range(4, len(t)) if t[i] == " " and " " not in t[i - 3 : i])
    out = backend.generate(prompts, max_new_tokens=12, greedy=True, stop_token_ids=[], stop_strings=[stop])
    for full, ids, reason in zip(texts, out.output_ids, out.finish_reasons):
        text = tok.decode(ids)
        if stop in full:
            # Ends at the piece whose leading "▁" completes the stop string, that piece included.
            assert reason == "stop" and full.startswith(text)
            assert stop in text and stop not in tok.decode(ids[:-1])
        else:
            assert reason == "length" and text == full


def test_passes_of_max_batch_size_rows_sample_as_one_pass(model, tok):
    # policy.generation_batch_size (NeMo RL's key): 10 rows in passes of 3 (3, 3, 3, 1); with per-row seeds each row
    # draws the same tokens and logprobs as in one pass, and stop strings stay with their rows.
    prompts = _prompts(10, seed=5)
    seeds = list(range(100, 110))
    stops = [["3"] if i % 2 else None for i in range(10)]
    whole = HFGenerationBackend(model, tok).generate(prompts, max_new_tokens=7, row_seeds=seeds, stop_strings=stops)
    passes = HFGenerationBackend(model, tok, max_batch_size=3).generate(prompts, max_new_tokens=7, row_seeds=seeds,
                                                                        stop_strings=stops)
    assert passes.output_ids == whole.output_ids and passes.finish_reasons == whole.finish_reasons
    for a, b in zip(passes.logprobs, whole.logprobs):
        torch.testing.assert_close(a, b)
