"""Model-loading options: hub ids without network, tokenizers without a pad token, bf16 autocast,
activation checkpointing."""

from __future__ import annotations

import copy

import pytest
import torch

from rlplane.config.loading import load_config
from rlplane.models import build_char_tokenizer, build_tiny_llama
from rlplane.models.configured import load_configured_policy
from rlplane.models.loading import ModelLoadError, ensure_pad_token, hub_reachable, load_policy
from rlplane.models.precision import autocast, set_precision
from rlplane.workers.logprobs import token_logprobs


def test_hub_id_without_network_fails_fast_with_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    assert not hub_reachable(timeout_s=1.0)
    with pytest.raises(ModelLoadError) as e:
        load_policy("someorg/not-cached-model")
    msg = str(e.value)
    assert "did not answer within 3 s (no network?)" in msg and "\n" not in msg


def test_tokenizer_without_pad_token_gets_one():
    tok = build_char_tokenizer()
    tok.pad_token = None
    model = build_tiny_llama(build_char_tokenizer())
    ensure_pad_token(tok, model)
    assert tok.pad_token == tok.eos_token and tok.pad_token_id == tok.eos_token_id

    tok = build_char_tokenizer()
    tok.pad_token, tok.eos_token = None, None
    ensure_pad_token(tok, model)  # neither pad nor eos: a <pad> special token, embeddings cover it
    assert tok.pad_token == "<pad>" and tok.pad_token_id is not None
    assert model.get_input_embeddings().weight.shape[0] >= len(tok)


def test_bf16_autocast_logprobs_close_to_fp32_and_inherited_by_copies():
    tok = build_char_tokenizer()
    model = build_tiny_llama(tok, seed=3)
    ids = torch.tensor([tok("12+34=46")["input_ids"]])
    attn = torch.ones_like(ids)
    fp32 = token_logprobs(model, ids, attn, 1.0)
    set_precision(model, "bf16")
    with autocast(model):
        mlp = model.model.layers[0].mlp
        assert mlp(torch.randn(1, 2, model.config.hidden_size)).dtype == torch.bfloat16  # matmuls really ran in bf16
        assert model(ids).logits.dtype == torch.float32  # but the lm_head stays fp32 (FP32OutputLinear)
    bf16 = token_logprobs(model, ids, attn, 1.0)
    assert bf16.dtype == torch.float32 and model.lm_head.weight.dtype == torch.float32  # master weights stay fp32
    assert not torch.equal(bf16, fp32) and torch.allclose(bf16, fp32, atol=0.05)
    assert copy.deepcopy(model).rlplane_autocast_dtype == torch.bfloat16  # the reference policy inherits it


def test_activation_checkpointing_same_gradients():
    grads = []
    for on in (False, True):
        cfg = load_config(None, [f"policy.activation_checkpointing={str(on).lower()}", "policy.precision=fp32"])
        model, tok = load_configured_policy(cfg.policy, cfg.loop.seed)
        flag = getattr(model, "is_activation_checkpointing", None)
        assert (flag if flag is not None else model.is_gradient_checkpointing) == on
        model.train()
        ids = torch.tensor([tok("12+34=46")["input_ids"]] * 2)
        token_logprobs(model, ids, torch.ones_like(ids), 1.0).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
