"""The embedded tokenizer and tiny Llama: ordinary HF artifacts, deterministic in their seed."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlplane.models import ModelLoadError, build_char_tokenizer, build_tiny_llama, load_policy


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def test_tokenizer_vocab_and_special_ids(tok):
    assert len(tok) == 21  # 4 special + 10 digits + "+-*=() "
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)


def test_tokenizer_one_token_per_char_with_bos(tok):
    ids = tok("(12+3)*4 = 60")["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert len(ids) == 1 + len("(12+3)*4 = 60")
    assert tok.unk_token_id not in ids
    assert tok("12", add_special_tokens=False)["input_ids"] == [tok.convert_tokens_to_ids("1"),
                                                                tok.convert_tokens_to_ids("2")]
    assert tok("a")["input_ids"] == [tok.bos_token_id, tok.unk_token_id]


def test_tokenizer_decode_round_trip(tok):
    text = "(12+3)*4 = 60"
    ids = tok(text)["input_ids"] + [tok.eos_token_id]
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode(ids) == "<bos>" + text + "<eos>"


def test_tokenizer_save_load_round_trip(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in ["12+34=", "7*8=56", "(1-2) = -1"]:
        assert loaded(text)["input_ids"] == tok(text)["input_ids"]
        assert loaded.decode(loaded(text)["input_ids"], skip_special_tokens=True) == text
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (0, 1, 2)


def test_model_shape_and_tied_embeddings(tok):
    model = build_tiny_llama(tok, hidden_size=32, num_layers=1, num_heads=2)
    assert model.config.vocab_size == len(tok)
    assert model.config.intermediate_size == 64
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    logits = model(torch.tensor([[1, 5, 6]])).logits
    assert logits.shape == (1, 3, len(tok))


def test_model_deterministic_in_seed_and_leaves_global_rng(tok):
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = build_tiny_llama(tok, hidden_size=32, num_layers=1, num_heads=2, seed=7)
    assert torch.equal(torch.rand(1), expected_next)  # global RNG untouched
    b = build_tiny_llama(tok, hidden_size=32, num_layers=1, num_heads=2, seed=7)
    c = build_tiny_llama(tok, hidden_size=32, num_layers=1, num_heads=2, seed=8)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.embed_tokens.weight"], sc["model.embed_tokens.weight"])


def test_model_save_load_round_trip(tok, tmp_path):
    model = build_tiny_llama(tok, hidden_size=32, num_layers=1, num_heads=2)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    x = torch.tensor([[1, 5, 14, 6, 17]])
    assert torch.allclose(model(x).logits, loaded(x).logits)


def test_load_policy_embedded_is_deterministic():
    m1, t1 = load_policy("embedded:tiny-llama", seed=3,
                         model_kwargs={"hidden_size": 32, "num_layers": 1, "num_heads": 2})
    m2, _ = load_policy("embedded:tiny-llama", seed=3,
                        model_kwargs={"hidden_size": 32, "num_layers": 1, "num_heads": 2})
    assert len(t1) == 21 and not m1.training
    assert all(torch.equal(p, q) for p, q in zip(m1.parameters(), m2.parameters()))


def test_load_policy_local_directory(tmp_path):
    model, tok = load_policy("embedded:tiny-llama", model_kwargs={"hidden_size": 32, "num_layers": 1, "num_heads": 2})
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, loaded_tok = load_policy(str(tmp_path))
    assert loaded_tok("1+2=")["input_ids"] == tok("1+2=")["input_ids"]
    x = torch.tensor([[1, 5, 14, 6, 17]])
    assert torch.allclose(model(x).logits, loaded(x).logits)


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("/no/such/model/dir", "no such directory"),
        ("./missing-model", "no such directory"),
        ("embedded:huge-llama", "unknown embedded model; known: embedded:tiny-llama"),
        ("someorg/not-cached-model", "not in the local Hugging Face cache"),
        ("packaged:gpt-17", "unknown packaged model; known: packaged:smollm2-135m-instruct"),
    ],
)
def test_load_policy_errors_are_one_line(name, fragment, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError) as e:
        load_policy(name)
    message = str(e.value)
    assert fragment in message and name in message and "\n" not in message


def test_load_policy_offline_hub_id_says_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match=r"hub is offline \(HF_HUB_OFFLINE=1\)"):
        load_policy("someorg/not-cached-model")


def test_load_policy_directory_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_policy(str(tmp_path))
