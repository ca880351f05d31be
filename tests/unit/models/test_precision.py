"""policy.precision: auto resolves by model size and a measured bf16 speed-up; bf16 generation and
training logprobs agree (token_mult_prob_error near 1)."""

from __future__ import annotations

import pytest
import torch

from rlplane.config.loading import load_config
from rlplane.generation import HFGenerationBackend
from rlplane.models import build_char_tokenizer, build_tiny_llama, precision as prec
from rlplane.workers.logprobs import token_logprobs


def _model(hidden: int):
    tok = build_char_tokenizer()
    return build_tiny_llama(tok, hidden_size=hidden, num_layers=2, num_heads=4, intermediate_size=2 * hidden,
                            seed=0), tok


def test_auto_is_the_default_and_explicit_choices_pass_through():
    assert load_config(None, []).policy.precision == "auto"
    model, _ = _model(64)
    assert prec.resolve_precision("bf16", model) == ("bf16", "set in the config")
    assert prec.resolve_precision("fp32", model)[0] == "fp32"
    with pytest.raises(ValueError, match="precision = 'fp16'"):
        prec.resolve_precision("fp16", model)


def test_auto_keeps_tiny_models_fp32_whatever_the_cpu(monkeypatch):
    monkeypatch.setattr(prec, "cpu_bf16_speedup", lambda: 2.0)
    model, _ = _model(128)  # the default job's width
    chosen, why = prec.resolve_precision("auto", model)
    assert chosen == "fp32" and "hidden_size 128" in why


@pytest.mark.parametrize("speedup, expected", [(2.1, "bf16"), (1.1, "fp32"), (0.1, "fp32")])
def test_auto_follows_the_measured_cpu_speedup(monkeypatch, speedup, expected):
    # 2.1x: a CPU with avx512_bf16 (measured ~2x); 0.1x: one without (bf16 emulated, 3-20x slower).
    monkeypatch.setattr(prec, "cpu_bf16_speedup", lambda: speedup)
    model, _ = _model(256)
    chosen, why = prec.resolve_precision("auto", model)
    assert chosen == expected and f"{speedup:.2f}x" in why


@pytest.mark.parametrize("bf16, expected", [(True, "bf16"), (False, "fp32")])
def test_auto_for_a_gpu_asks_the_gpu_not_the_host(monkeypatch, bf16, expected):
    # A model is loaded on the host and moved to its GPU later: the GPU's bf16 support decides, whatever
    # the host's matmul speed-up (the host's measurement must not even be taken).
    monkeypatch.setattr(prec, "cpu_bf16_speedup", lambda: pytest.fail("measured the host for a GPU model"))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: bf16)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "GPU-X")
    model, _ = _model(256)
    chosen, why = prec.resolve_precision("auto", model, torch.device("cuda", 0))
    assert chosen == expected and why.startswith("GPU-X ")


@pytest.mark.parametrize("device", ["cpu", "auto", "cuda"])
@pytest.mark.parametrize("gpu_visible", [False, True])
def test_configured_policy_decides_precision_for_its_device(monkeypatch, device, gpu_visible):
    # A process that sees a GPU decides for it under auto/cuda; one that sees none (a Ray driver loading
    # the model for itself) decides for its host rather than failing.
    from rlplane.models import configured

    seen = []
    monkeypatch.setattr(configured, "apply_precision", lambda model, precision, device: seen.append(device))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu_visible)
    cfg = load_config(None, [f"policy.device={device}"])
    configured.load_configured_policy(cfg.policy, 0)
    assert seen == [torch.device("cuda" if gpu_visible and device != "cpu" else "cpu")]


def test_apply_precision_records_and_announces_once(monkeypatch, capsys):
    monkeypatch.setattr(prec, "cpu_bf16_speedup", lambda: 2.0)
    monkeypatch.setattr(prec, "_announced", set())
    for _ in range(2):
        model, _ = _model(256)
        assert prec.apply_precision(model, "auto") == "bf16"
        assert model.rlplane_autocast_dtype == torch.bfloat16
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines == ["policy.precision: auto -> bf16 (bf16 matmul 2.00x "
                     "as fast as fp32 on this CPU (bf16 needs >= 1.3x))"]


def test_cpu_bf16_speedup_is_measured_and_positive():
    prec.cpu_bf16_speedup.cache_clear()
    s = prec.cpu_bf16_speedup(budget_s=0.005)
    assert s > 0 and prec.cpu_bf16_speedup(budget_s=0.005) == s  # cached per arguments


def test_bf16_generation_logprobs_match_bf16_training_logprobs():
    """token_mult_prob_error = mean over tokens of exp(|generation lp - training lp|): with both
    forwards under bf16 autocast it stays near 1 (the KV-cached decode and the full-sequence
    forward round differently, nothing more)."""
    model, tok = _model(256)
    prec.set_precision(model, "bf16")
    prompts = [tok("12+34=")["input_ids"], tok("7+5=")["input_ids"]] * 4
    out = HFGenerationBackend(model, tok).generate(prompts, max_new_tokens=8, stop_token_ids=[], seed=0)
    errors = []
    for p, ids, lp in zip(prompts, out.output_ids, out.logprobs):
        full = torch.tensor([p + ids])
        train_lp = token_logprobs(model, full, torch.ones_like(full), 1.0)[0, len(p):]
        errors.append(torch.exp((train_lp - lp).abs()))
    err = torch.cat(errors).mean().item()
    assert 1.0 <= err < 1.02, err


def test_bf16_keeps_the_lm_head_fp32_without_renaming_anything():
    model, tok = _model(64)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    keys = list(model.state_dict())
    prec.set_precision(model, "bf16")
    assert type(model.lm_head) is prec.FP32OutputLinear and list(model.state_dict()) == keys
    assert model.lm_head.weight is model.get_input_embeddings().weight  # still tied
    ids = torch.tensor([tok("12+34=46")["input_ids"]])
    with prec.autocast(model):
        assert model(ids).logits.dtype == torch.float32
    prec.set_precision(model, "fp32")
    assert type(model.lm_head) is torch.nn.Linear
