"""The fused shared-prefix training forward against the model's own two calls (prompts with a cache, then the
responses over the cache copied to every row): logits and gradients, for Llama with full and grouped-query
attention, Qwen2 (q/k/v biases), rows in GRPO's grouped order and in any order, no response at all, and bf16
autocast. The recipe-level twin (losses, metrics, micro-batches) is tests/unit/workers/test_shared_prefix.py."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rlplane.fast import fused_train
from rlplane.fast.switches import FUSED_TRAIN
from rlplane.generation.kv_cache import cache_kwarg
from rlplane.models.precision import autocast, set_precision

V = 23


def _model(kind: str, kv_heads: int = 4):
    shape = dict(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=kv_heads, intermediate_size=96, max_position_embeddings=64,
                 attn_implementation="eager")
    torch.manual_seed(0)
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**shape, tie_word_embeddings=False))
        with torch.no_grad():  # non-zero biases, so a lost one shows
            for layer in model.model.layers:
                for m in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    m.bias.normal_(0, 0.5)
        return model.train()
    return LlamaForCausalLM(LlamaConfig(**shape, tie_word_embeddings=True)).train()


def _inputs(order: str, r: int):
    """4 prompts (lengths 2..6, right-padded to 6) x 3 rows, responses of 0..r fed tokens."""
    g = torch.Generator().manual_seed(1)
    u, group, p = 4, 3, 6
    lengths = torch.tensor([6, 2, 4, 5])
    prefix_mask = (torch.arange(p)[None] < lengths[:, None]).long()
    prefix_ids = torch.randint(1, V, (u, p), generator=g).masked_fill(prefix_mask == 0, 0)
    rows = torch.arange(u).repeat_interleave(group)
    if order == "any":
        rows = rows[torch.randperm(len(rows), generator=g)]
    fed = torch.randint(0, r + 1, (len(rows),), generator=g)
    valid = torch.arange(r)[None] < fed[:, None]
    resp_ids = torch.randint(1, V, (len(rows), r), generator=g).masked_fill(~valid, 0)
    positions = lengths[rows][:, None] + torch.arange(r)[None]
    return prefix_ids, prefix_mask, rows, resp_ids, positions, valid


def _module_stack(model, prefix_ids, prefix_mask, rows, resp_ids, positions, valid):
    u, p = prefix_ids.shape
    out = model(input_ids=prefix_ids, attention_mask=prefix_mask, position_ids=torch.arange(p)[None].expand(u, p),
                use_cache=True)
    if resp_ids.shape[1] == 0:
        return out.logits, out.logits.new_zeros((len(rows), 0, out.logits.shape[-1]))
    cache = out.past_key_values
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys.index_select(0, rows), layer.values.index_select(0, rows)
    mask = torch.cat([prefix_mask[rows], valid.long()], dim=1)
    rest = model(input_ids=resp_ids, attention_mask=mask, position_ids=positions, **{cache_kwarg(model): cache},
                 use_cache=True).logits
    return out.logits, rest


def _run(model, fn, inputs):
    model.zero_grad(set_to_none=True)
    with autocast(model):
        prompt_logits, resp_logits = fn(model, *inputs)
    prefix_mask, valid = inputs[1], inputs[5]
    # A loss over every real position (right padding and unfed tokens excluded), so every gradient path counts.
    loss = ((prompt_logits.float().log_softmax(-1)[..., 5] * prefix_mask).sum()
            + (resp_logits.float().log_softmax(-1)[..., 7] * valid).sum())
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return prompt_logits.detach(), resp_logits.detach(), grads


CASES = {
    "llama, grouped rows": ("llama", 4, "grouped", 3, "fp32"),
    "llama, rows in any order": ("llama", 4, "any", 3, "fp32"),
    "llama, grouped-query attention": ("llama", 2, "grouped", 3, "fp32"),
    "llama, no response token fed": ("llama", 4, "grouped", 0, "fp32"),
    "qwen2 with biases": ("qwen2", 2, "grouped", 3, "fp32"),
    "llama, bf16 autocast": ("llama", 2, "grouped", 3, "bf16"),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_fused_forward_matches_the_module_stack(case):
    kind, kv_heads, order, r, precision = case
    model = _model(kind, kv_heads)
    set_precision(model, precision)
    assert fused_train.usable(model)
    inputs = _inputs(order, r)
    ref_prompt, ref_resp, ref_grads = _run(model, _module_stack, inputs)
    prompt, resp, grads = _run(model, fused_train.prefix_logits, inputs)
    prefix_mask, valid = inputs[1].bool(), inputs[5]
    assert resp.shape == ref_resp.shape
    # bf16: both round the matmuls' inputs to bf16, in places that differ by a rounding (a fused q/k/v matmul,
    # the prompt part summed apart): logits agree to bf16's resolution at |logit| of a few units.
    tol = dict(atol=1e-5, rtol=1e-4) if precision == "fp32" else dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(prompt[prefix_mask], ref_prompt[prefix_mask], **tol)
    torch.testing.assert_close(resp[valid], ref_resp[valid], **tol)
    assert ref_grads.keys() == grads.keys()
    for name, g in ref_grads.items():
        scale = g.abs().max().clamp(min=1e-6)
        err = float((grads[name] - g).abs().max() / scale)
        assert err < (1e-4 if precision == "fp32" else 5e-2), (name, err)


def test_the_switch_and_unsupported_models_take_the_module_stack(monkeypatch):
    model = _model("llama")
    assert fused_train.usable(model)
    monkeypatch.setenv(FUSED_TRAIN, "0")
    assert not fused_train.usable(model)
    monkeypatch.delenv(FUSED_TRAIN)
    model.config.attention_dropout = 0.1  # dropout in training: the module stack draws it
    assert not fused_train.usable(model)
    assert fused_train.usable(model.eval())
    model.model.layers[0].mlp.up_proj = torch.nn.Sequential(model.model.layers[0].mlp.up_proj)  # a wrapped Linear
    assert not fused_train.usable(model)
