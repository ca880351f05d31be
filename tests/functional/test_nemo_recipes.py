"""NeMo RL's recipes (tests/fixtures/nemo: GRPO math with ``defaults:`` and ``${...}``, its tq_simple layer,
async 1-off, PPO, distillation) train on the embedded tiny model, given as a NeMo RL user gives them:
the model by name (its tokenizer following ``${policy.model_name}``), a local ResponseDataset, no prompt
file, sizes for a CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import rlplane
from rlplane.config.loading import load_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nemo"


def nemo_user_overrides(loop: str, data: Path, generations: int) -> list[str]:
    return ["policy.model_name=embedded:tiny-llama", "policy.generation.backend=hf",
            "data.train.dataset_name=ResponseDataset", f"data.train.data_path={data}", "data.train.input_key=question",
            "data.train.output_key=answer", "data.default.prompt_file=null", "env.math.num_workers=1",
            "policy.max_total_sequence_length=32", "policy.generation.max_new_tokens=8",
            f"{loop}.num_prompts_per_step=2", f"{loop}.num_generations_per_prompt={generations}",
            f"policy.train_global_batch_size={2 * generations}", "policy.train_micro_batch_size=2",
            f"{loop}.max_num_steps=2"]


@pytest.mark.slow
@pytest.mark.parametrize("name, loop, generations, extra", [
    ("grpo-llama3.2-1b-instruct-1n1g", "grpo", 2, []),
    ("grpo-llama3.2-1b-instruct-1n1g-tq_simple", "grpo", 2, []),
    ("grpo-math-1B-async-1off", "grpo", 2, []),
    ("ppo_math_1B", "ppo", 2, ["ppo.ppo_epochs=1"]),
    # its validation set is AIME2024 from the hub (test_nemo_as_is.py reads it from a cache): here the local file
    ("distillation_math", "distillation", 1, ["teacher.model_name=embedded:tiny-llama",
                                              "data.validation.dataset_name=ResponseDataset",
                                              "data.validation.data_path={data}",
                                              "data.validation.input_key=question", "data.validation.output_key=answer",
                                              "data.validation.repeat=1"]),
])
def test_nemo_recipe_trains(tmp_path, name, loop, generations, extra):
    data = tmp_path / "local.jsonl"
    data.write_text("".join(json.dumps({"question": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                            for a in range(4) for b in range(4)))
    run = tmp_path / "run"
    cfg = load_config(str(FIXTURES / f"{name}.yaml"), [
        *nemo_user_overrides(loop, data, generations), *(x.format(data=data) for x in extra), f"run_dir={run}",
        "logger.log_dir=null", "checkpointing.checkpoint_dir=null", "logger.progress_bar=false"])
    assert cfg.data.train.path == str(data) and cfg.algorithm == loop
    rlplane.train(cfg, quiet=True)
    rows = [json.loads(r) for r in (run / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "timing/train/total_step_time" in r]
    assert len(steps) == 2
