"""NeMo RL configs as a user hands them in: ``rlplane.load_config(path)`` reads NeMo RL files as the
command does; NeMo RL's message-level advantage penalties refused in one line naming the keys (its
data-plane trainer refuses them too); a NeMo prompt file keeps its literal ``{{}}``."""

from __future__ import annotations

from pathlib import Path

import pytest

import rlplane
from rlplane.config.loading import ConfigError, load_config
from rlplane.config.loops import PENALTY_KEYS

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nemo"
LOCAL = ["policy.model_name=embedded:tiny-llama", "data.dataset=arithmetic", "policy.generation.backend=hf"]


def test_python_load_config_reads_nemo_files_like_the_command(capsys):
    path = str(FIXTURES / "grpo_math_tiny_child.yaml")
    cfg = rlplane.load_config(path, LOCAL)
    assert "read as NeMo RL format" in capsys.readouterr().err
    assert cfg == load_config(path, LOCAL)
    assert cfg.grpo.num_prompts_per_step == 2 and cfg.grpo.adv_estimator.use_leave_one_out_baseline is False


@pytest.mark.parametrize("source", ["rlplane", "nemo"])
def test_message_level_penalties_are_one_line_naming_the_keys(source):
    given = ["grpo.invalid_tool_call_advantage=-1.0", "grpo.malformed_thinking_advantage=-0.5"]
    with pytest.raises(ConfigError) as e:
        if source == "rlplane":
            load_config(None, given)
        else:
            load_config(str(FIXTURES / "grpo_math_tiny.yaml"), [*LOCAL, *given])
    (line,) = e.value.problems
    assert line.startswith("grpo.invalid_tool_call_advantage = -1.0, grpo.malformed_thinking_advantage = -0.5: "
                           "message-level advantage penalties are not supported by the data-plane GRPO trainer")
    assert PENALTY_KEYS == ("invalid_tool_call_advantage", "malformed_thinking_advantage")


def test_null_penalties_load_as_nemo_files_have_them():
    cfg = load_config(str(FIXTURES / "grpo_math_tiny.yaml"), LOCAL)  # the fixture sets both to null
    assert cfg.grpo.invalid_tool_call_advantage is None and cfg.grpo.malformed_thinking_advantage is None
    assert load_config(None, ["grpo.invalid_tool_call_advantage=null"]).grpo.invalid_tool_call_advantage is None


def test_a_nemo_prompt_file_reaches_the_prompt_with_its_literal_braces(tmp_path):
    from rlplane.datasets import task_processors
    from rlplane.models import build_char_tokenizer

    data, cot, system = tmp_path / "train.jsonl", tmp_path / "cot.txt", tmp_path / "sys.txt"
    data.write_text('{"question": "1+1=", "expected": "2"}\n')
    cot.write_text("Answer in \\boxed{{}}:\n{}")
    system.write_text("You are exact.")
    cfg = load_config(str(FIXTURES / "grpo_math_tiny.yaml"), [
        "policy.model_name=embedded:tiny-llama", "policy.generation.backend=hf", f"data.train.data_path={data}",
        "data.train.dataset_name=ResponseDataset", "data.train.input_key=question", "data.train.output_key=expected",
        f"data.default.prompt_file={cot}", f"+data.default.system_prompt_file={system}"])
    spec, _ = task_processors(cfg.data, build_char_tokenizer())
    assert spec.prompt_format.template.format(problem="1+1=") == "Answer in \\boxed{}:\n1+1="
    assert spec.prompt_format.system_prompt == "You are exact."


def test_a_nemo_processor_name_reaches_data_prompt_processor(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1+1=", "expected": "2"}\n')
    cfg = load_config(str(FIXTURES / "grpo_math_tiny.yaml"), [
        "policy.model_name=embedded:tiny-llama", "policy.generation.backend=hf", f"data.train.data_path={data}",
        "data.train.dataset_name=ResponseDataset", "data.default.prompt_file=null",
        "data.default.processor=tests.unit.data.test_task_processing:two_turn_processor"])
    assert cfg.data.prompt.processor == "tests.unit.data.test_task_processing:two_turn_processor"
