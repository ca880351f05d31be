"""NeMo RL's own example configs, as they ship (tests/fixtures/nemo/upstream), train two steps at their own sizes,
run from a NeMo RL tree with only the model named (the embedded tiny Llama) and the step count: their datasets are
read by name from local stand-ins of the hub repos in a Hugging Face cache (tests/fixtures/nemo/hub_standins.py),
offline. Slow: these are the files' real batch sizes (up to 2048 samples a step); the three largest (minutes each)
are the heavy tier, run with `pytest --heavy`. Every file is read and checked by
tests/unit/config/test_nemo_upstream.py."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

import rlplane
from rlplane.config.loading import load_config

UPSTREAM = Path(__file__).resolve().parents[1] / "fixtures" / "nemo" / "upstream"
sys.path.insert(0, str(UPSTREAM.parent))
from hub_standins import use_standins  # noqa: E402

MODEL = "policy.model_name=embedded:tiny-llama"
LLM = "examples/configs/recipes/llm"
HEAVY = pytest.mark.heavy  # minutes each at their own sizes (docs/benchmarks.md): `pytest --heavy`
CASES = [  # (file, loop, what else a NeMo RL user gives on this machine)
    pytest.param("examples/configs/grpo_math_1B.yaml", "grpo", []),
    pytest.param("examples/configs/ppo_math_1B.yaml", "ppo", []),
    # A hub teacher too; a larger embedded one (the same shape and seed would be the student itself).
    pytest.param("examples/configs/distillation_math.yaml", "distillation",
                 ["teacher.model_name=embedded:tiny-llama", "teacher.tiny.hidden_size=256",
                  "teacher.tiny.num_heads=8"]),
    pytest.param("examples/configs/grpo_sliding_puzzle.yaml", "grpo", [], marks=HEAVY),
    pytest.param("examples/configs/gdpo_math_1B.yaml", "grpo", []),
    pytest.param("examples/configs/grpo_smoke.yaml", "grpo", []),
    pytest.param(f"{LLM}/grpo-llama3.2-1b-instruct-1n8g-fsdp2tp1.v3-tq_simple.yaml", "grpo", []),
    pytest.param(f"{LLM}/grpo-deepscaler-1.5b-8K-tq_simple.yaml", "grpo", [], marks=HEAVY),
    # Megatron-Core in NeMo RL; its own switch back to the DTensor worker.
    pytest.param(f"{LLM}/performance/grpo-llama3.1-8b-instruct-2n8g-async-1off.yaml", "grpo",
                 ["policy.megatron_cfg.enabled=false", "policy.dtensor_cfg.enabled=true"], marks=HEAVY),
]


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory):
    return tmp_path_factory.mktemp("hf")


@pytest.mark.slow
@pytest.mark.parametrize("name, loop, extra", CASES, ids=[Path(c.values[0]).stem for c in CASES])
def test_nemo_config_trains_two_steps_as_it_ships(tmp_path, monkeypatch, hf_home, name, loop, extra):
    use_standins(monkeypatch, hf_home, rows=300)
    monkeypatch.setenv("WANDB_MODE", "offline")  # several files log to wandb; this machine has no network
    shutil.copytree(UPSTREAM / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)  # a NeMo RL tree: prompt files, run and checkpoint directories relative to it
    cfg = load_config(name, [MODEL, *extra, f"{loop}.max_num_steps=2"])
    assert cfg.algorithm == ("grpo" if loop == "grpo" else loop)
    rlplane.train(cfg, quiet=True)
    logs = Path(cfg.logger.log_dir) if cfg.logger.log_dir else Path(cfg.run_dir) / "logs"  # NeMo's log_dir is kept
    rows = [json.loads(r) for r in (logs / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "timing/train/total_step_time" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["train/grad_norm"] >= 0 for r in steps)
