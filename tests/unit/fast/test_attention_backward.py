"""A bf16 CPU training forward's attention takes a matmul backward: the forward as SDPA computes it (bit for bit),
the gradient against an fp64 reference as close as SDPA's own, and only where it applies."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from rlplane.fast import attention_backward as ab
from rlplane.models.precision import set_precision

REAL_BACKWARD = ab._SDPAMatmulBackward.backward


def _qkv(hq=6, hk=2, t=7, s=7, d=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, h, n, d, generator=g, dtype=dtype).requires_grad_() for h, n in ((hq, t), (hk, s), (hk, s))]


def _masks(t=7, s=7):
    g = torch.Generator().manual_seed(3)
    padded = torch.ones(2, 1, t, s, dtype=torch.bool).tril()
    padded[0, :, :, :2] = False  # left padding: rows 0-1 of the first sequence attend to nothing
    return {"none": None, "padded bool": padded, "per-head bool": torch.rand(2, 6, t, s, generator=g) > 0.3,
            "additive 2-d": torch.randn(t, s, generator=g, dtype=torch.float64)}


@pytest.mark.parametrize("mask_name,is_causal", [("none", False), ("none", True), ("padded bool", False),
                                                  ("per-head bool", False), ("additive 2-d", False)])
@pytest.mark.parametrize("hk", [6, 2, 1])  # plain, grouped, one key/value head
def test_gradients_match_autograd_of_sdpa(mask_name, is_causal, hk):
    mask = _masks()[mask_name]  # (SDPA takes a mask or is_causal, not both)
    q, k, v = _qkv(hk=hk)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=hk != 6,
                                         scale=0.3)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    dq, dk, dv = ab.attention_grads(q.detach(), k.detach(), v.detach(), out.detach(), grad_out, mask, is_causal,
                                    scale=0.3)
    # computed in fp32 from fp64 inputs: fp32 rounding of values of order 1
    for ours, ref in ((dq, q.grad), (dk, k.grad), (dv, v.grad)):
        torch.testing.assert_close(ours, ref, rtol=0, atol=2e-6)
    if mask_name == "padded bool":  # a row that attends to nothing: output 0, and it sends no gradient
        assert out[0, :, :2].abs().max() == 0 and dq[0, :, :2].abs().max() == 0


def test_default_scale_is_one_over_sqrt_d():
    q, k, v = _qkv(hk=6)
    out = F.scaled_dot_product_attention(q, k, v)
    grad_out = torch.ones_like(out)
    out.backward(grad_out)
    dq, _, _ = ab.attention_grads(q.detach(), k.detach(), v.detach(), out.detach(), grad_out)
    torch.testing.assert_close(dq, q.grad, rtol=0, atol=2e-6)


def _under_autocast(fn, q, k, v, mask):
    """fp32 queries and keys, bf16 values (as a Llama layer hands them over under autocast): output and grads."""
    q, k, v = (x.detach().float().clone().requires_grad_() for x in (q, k, v))
    v_bf16 = v.bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fn(q, k, v_bf16, attn_mask=mask, enable_gqa=True)
    out.backward((torch.arange(out.numel()).reshape(out.shape) % 7 - 3).to(out.dtype) / 3)
    return out.detach(), [x.grad for x in (q, k, v)]


def test_bf16_forward_is_sdpas_bit_for_bit_and_gradients_as_close_to_fp64():
    q, k, v = _qkv(hq=6, hk=2, t=24, s=24, d=16)
    mask = _masks(24, 24)["padded bool"]
    plain_out, plain_grads = _under_autocast(F.scaled_dot_product_attention, q, k, v, mask)
    ours_out, ours_grads = _under_autocast(ab.sdpa_matmul_backward, q, k, v, mask)
    assert torch.equal(plain_out, ours_out)
    # the fp64 truth for the same (bf16-rounded) operands
    qr, kr, vr = (x.detach().bfloat16().double().requires_grad_() for x in (q, k, v))
    ref = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=mask, enable_gqa=True)
    ref.backward((torch.arange(ref.numel()).reshape(ref.shape) % 7 - 3).double() / 3)
    for plain, ours, truth in zip(plain_grads, ours_grads, (qr.grad, kr.grad, vr.grad)):
        plain_err, ours_err = (plain.double() - truth).abs().max(), (ours.double() - truth).abs().max()
        assert ours_err <= 1.5 * plain_err + 1e-3, (ours_err, plain_err)


def test_routes_only_calls_that_apply(monkeypatch):
    q, k, v = (x.detach().float().bfloat16().requires_grad_() for x in _qkv(hk=2))
    routed = ab.sdpa_matmul_backward(q, k, v, enable_gqa=True)
    assert type(routed.grad_fn).__name__ == "_SDPAMatmulBackwardBackward"
    skipped = {
        "no grad": lambda: ab.sdpa_matmul_backward(q.detach(), k.detach(), v.detach(), enable_gqa=True),
        "dropout": lambda: ab.sdpa_matmul_backward(q, k, v, dropout_p=0.1, enable_gqa=True),
        "fp32": lambda: ab.sdpa_matmul_backward(q.float(), k.float(), v.float(), enable_gqa=True),
    }
    for name, call in skipped.items():
        out = call()
        assert out.grad_fn is None or "Matmul" not in type(out.grad_fn).__name__, name
    monkeypatch.setattr(ab, "MAX_SCORES", 2 * 6 * 7 * 7 - 1)  # one element short of this call's scores
    assert "Matmul" not in type(ab.sdpa_matmul_backward(q, k, v, enable_gqa=True).grad_fn).__name__


def _llama(precision: str, checkpointing: bool = False) -> LlamaForCausalLM:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa"))
    set_precision(model, precision)
    if checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def _grads(model, routed: bool, monkeypatch) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[str]]:
    """Loss and gradients of one padded batch under bf16 autocast, and the attention backwards that ran."""
    monkeypatch.setenv("RLPLANE_MATMUL_ATTENTION_BACKWARD", "1" if routed else "0")
    ids = torch.randint(0, 64, (3, 10), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones(3, 10, dtype=torch.long)
    attention_mask[0, :3] = 0
    seen = []

    def counting(ctx, grad_out):
        seen.append("matmul")
        return REAL_BACKWARD(ctx, grad_out)

    monkeypatch.setattr(ab._SDPAMatmulBackward, "backward", staticmethod(counting))
    with ab.matmul_attention_backward(model), torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, attention_mask=attention_mask, labels=ids).loss
        loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads, seen


def test_a_bf16_llama_trains_through_it_like_the_twin(monkeypatch):
    model = _llama("bf16")
    twin_loss, twin, twin_seen = _grads(model, False, monkeypatch)
    loss, ours, seen = _grads(model, True, monkeypatch)
    assert twin_seen == [] and seen == ["matmul"] * 2  # one per layer
    assert torch.equal(loss, twin_loss)  # the forward is untouched
    for name in twin:  # bf16 training gradients, rounded differently: relative to each tensor's size
        scale = twin[name].abs().max()
        torch.testing.assert_close(ours[name], twin[name], rtol=0, atol=0.02 * scale + 1e-6)


def test_checkpointed_fp32_and_switched_off_models_keep_sdpas_backward(monkeypatch):
    null = type(ab.contextlib.nullcontext())
    assert isinstance(ab.matmul_attention_backward(_llama("fp32")), null)
    # A checkpointed forward is recomputed outside the context: it must save what the first one saved.
    checkpointed = _llama("bf16", checkpointing=True)
    assert isinstance(ab.matmul_attention_backward(checkpointed), null)
    _grads(checkpointed, True, monkeypatch)  # trains (a routed first forward would fail the recomputation check)
    monkeypatch.setenv("RLPLANE_MATMUL_ATTENTION_BACKWARD", "0")
    assert isinstance(ab.matmul_attention_backward(_llama("bf16")), null)
    monkeypatch.setenv("RLPLANE_MATMUL_ATTENTION_BACKWARD", "1")
    assert isinstance(ab.matmul_attention_backward(_llama("bf16")), ab._RouteSDPA)


def test_scores_exactly_at_the_limit_still_route(monkeypatch):
    q, k, v = (x.detach().bfloat16().requires_grad_() for x in _qkv(hk=2))
    monkeypatch.setattr(ab, "MAX_SCORES", 2 * 6 * 7 * 7)  # this call's scores, to the element
    assert type(ab.sdpa_matmul_backward(q, k, v, enable_gqa=True).grad_fn).__name__ == "_SDPAMatmulBackwardBackward"
