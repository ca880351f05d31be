"""NeMo RL's own example configs, byte for byte (tests/fixtures/nemo/upstream, fetch.sh pins the commit), read as a
NeMo RL user runs them: from the repository root, only the model named. Each reads with no error line; the keys
NeMo's files use mean what they mean there; docs/nemo.md names every key they hold."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlplane.config.loading import load_config
from rlplane.config.nemo_yaml import _paths, load_nemo_chain

ROOT = Path(__file__).resolve().parents[2] / "fixtures" / "nemo" / "upstream"
DOCS = Path(__file__).resolve().parents[3] / "docs" / "nemo.md"
CONFIGS = "examples/configs"
LLM = f"{CONFIGS}/recipes/llm"
MODEL = ["policy.model_name=embedded:tiny-llama"]
# The files the docs' table names, each with what a NeMo RL user gives besides them.
FILES = {
    f"{CONFIGS}/grpo_math_1B.yaml": MODEL,
    f"{CONFIGS}/ppo_math_1B.yaml": MODEL,
    f"{CONFIGS}/distillation_math.yaml": [*MODEL, "teacher.model_name=embedded:tiny-llama"],
    f"{CONFIGS}/grpo_sliding_puzzle.yaml": MODEL,
    f"{CONFIGS}/gdpo_math_1B.yaml": MODEL,
    f"{CONFIGS}/grpo_smoke.yaml": MODEL,
    f"{LLM}/grpo-llama3.2-1b-instruct-1n8g-fsdp2tp1.v3-tq_simple.yaml": MODEL,
    f"{LLM}/grpo-qwen2.5-math-1.5b-instruct-1n8g-fsdp2tp1.v3-tq_simple.yaml": MODEL,
    f"{LLM}/grpo-gemma3-1b-it-1n8g-fsdp2tp1-tq_simple.yaml": MODEL,
    f"{LLM}/grpo-deepscaler-1.5b-8K-tq_simple.yaml": MODEL,
    f"{LLM}/grpo-gspo-deepscaler-1.5b-8K-tq_simple.yaml": MODEL,
    f"{LLM}/grpo-llama3.1-8b-instruct-2n8g-fsdp2tp1-noncolocated-tq_simple.yaml": MODEL,
    # NeMo RL trains these with Megatron-Core; its own switch back to the DTensor worker reads them.
    f"{LLM}/performance/grpo-llama3.1-8b-instruct-2n8g-async-1off.yaml": [
        *MODEL, "policy.megatron_cfg.enabled=false", "policy.dtensor_cfg.enabled=true"],
    f"{LLM}/performance/grpo-llama3.1-8b-instruct-2n4g-async-1off.yaml": [
        *MODEL, "policy.megatron_cfg.enabled=false", "policy.dtensor_cfg.enabled=true"],
}


@pytest.fixture(autouse=True)
def in_nemo_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # NeMo RL names its prompt files from the repository root


def load(name: str, *extra: str):
    return load_config(name, [*FILES[name], *extra])


@pytest.mark.parametrize("name", list(FILES))
def test_each_file_reads_with_no_error_line(name, capsys):
    load(name)
    err = capsys.readouterr().err
    assert "read as NeMo RL format" in err.splitlines()[0]
    assert "error" not in err


def test_the_async_recipes_name_megatron_which_stays_refused():
    from rlplane.config.loading import ConfigError

    with pytest.raises(ConfigError) as e:
        load_config(f"{LLM}/performance/grpo-llama3.1-8b-instruct-2n8g-async-1off.yaml", MODEL)
    assert [p.split(" = ")[0] for p in e.value.problems] == ["policy.megatron_cfg.enabled"]


def test_grpo_math_reads_openmathinstruct_held_out_as_nemo_rl():
    cfg = load(f"{CONFIGS}/grpo_math_1B.yaml")
    t = cfg.data.train
    assert (cfg.data.dataset, t.name, t.split_validation_size, t.seed, cfg.data.validation) == (
        "registry", "OpenMathInstruct-2", 0.05, 42, None)
    assert cfg.data.prompt.prompt_file == "examples/prompts/cot.txt" and cfg.data.prompt.processor == "math"


def test_smoke_has_no_periodic_validation():
    g = load(f"{CONFIGS}/grpo_smoke.yaml").grpo
    assert g.val_period == -1 and not any(g.validates_after(n) for n in range(1, 20))
    assert load(f"{CONFIGS}/grpo_smoke.yaml", "grpo.val_period=3").grpo.validates_after(6)


def test_distillation_is_nemo_rls_top_k_mixed_kl():
    cfg = load(f"{CONFIGS}/distillation_math.yaml")
    lf = cfg.loss_fn.distillation_options()
    assert (lf.kl_type, lf.mixed_kl_weight, lf.zero_outside_topk, cfg.distillation.topk_logits_k) == (
        "mixed", 0.5, False, 64)
    assert cfg.policy.train_global_batch_size == 64 and cfg.distillation.num_prompts_per_step == 128  # 2 steps
    assert (cfg.data.train.name, cfg.data.validation.name, cfg.data.validation.repeat) == ("DeepScaler", "AIME2024", 16)


def test_tensor_and_context_parallelism_read_as_fsdp2_with_a_note(capsys):
    load(f"{CONFIGS}/distillation_math.yaml")
    err = capsys.readouterr().err
    assert "policy.dtensor_cfg.{tensor_parallel_size = 2, context_parallel_size = 2}: NeMo RL splits" in err
    assert "teacher.dtensor_cfg.{tensor_parallel_size = 4, context_parallel_size = 2}" in err
    # Ranks asked for: NeMo RL's FSDP2 over them (rlplane's FSDP2 cuts micro-batches by rows: no dynamic batching).
    cfg = load(f"{CONFIGS}/distillation_math.yaml", "runtime=ray", "policy.dp_size=2",
               "policy.dynamic_batching.enabled=false")
    assert cfg.policy.dtensor_cfg.enabled and cfg.data_plane.backend == "ray"


def test_cpu_offload_and_sequence_parallel(capsys):
    cfg = load(f"{CONFIGS}/grpo_sliding_puzzle.yaml")
    err = capsys.readouterr().err
    assert "sequence_parallel = true: NeMo RL's sequence parallelism" in err and "does nothing" in err
    assert "cpu_offload = true: FSDP2's CPU offload of sharded ranks" in err
    assert not cfg.policy.dtensor_cfg.cpu_offload  # one unsharded rank: nothing to offload
    sharded = load(f"{CONFIGS}/grpo_sliding_puzzle.yaml", "runtime=ray", "policy.dp_size=2",
                   "policy.sequence_packing.enabled=false")
    assert sharded.policy.dtensor_cfg.enabled and sharded.policy.dtensor_cfg.cpu_offload


def test_sliding_puzzle_draws_its_boards():
    cfg = load(f"{CONFIGS}/grpo_sliding_puzzle.yaml")
    e = cfg.env.sliding_puzzle_game
    assert cfg.data.dataset == "sliding_puzzle" and (e.size, e.shuffle_moves, e.max_moves) == (5, 10, 30)
    assert cfg.grpo.max_rollout_turns == 50


def test_gdpo_scores_three_components_on_gsm8k():
    cfg = load(f"{CONFIGS}/gdpo_math_1B.yaml")
    assert cfg.grpo.adv_estimator.name == "gdpo" and cfg.data.train.default_task_name == "math_multi_reward"
    assert (cfg.data.train.split, cfg.data.validation.split) == ("train", "test")
    assert cfg.data.prompt.system_prompt_file == "examples/prompts/gsm8k.txt"


def test_ppo_checks_answers_as_dapo():
    cfg = load(f"{CONFIGS}/ppo_math_1B.yaml")
    assert cfg.env.math.math_verify_impl == "dapo_math_verify"
    assert (cfg.data.train.name, cfg.data.validation.name) == ("DAPOMath17K", "DAPOMathAIME2024")


def test_async_one_off_keeps_its_stop_token_and_forced_ratio():
    cfg = load(f"{LLM}/performance/grpo-llama3.1-8b-instruct-2n8g-async-1off.yaml")
    assert cfg.policy.generation.stop_token_ids == [128009]
    assert cfg.grpo.async_grpo.enabled and cfg.loss_fn.force_on_policy_ratio


def test_deepscaler_recipe_keeps_its_engine_arguments_for_vllm(capsys):
    load(f"{LLM}/grpo-deepscaler-1.5b-8K-tq_simple.yaml")
    assert "vllm_kwargs = {'compilation_config'" in capsys.readouterr().err  # unused on hf: noted


def _named_in_docs() -> tuple[set[str], list[str]]:
    """Keys the docs name in code spans (``a.{b, c}`` expanded), and the prefixes they name as ``a.*``."""
    names, prefixes = set(), []
    text = re.sub(r"```.*?```", "", DOCS.read_text(), flags=re.DOTALL)  # code blocks: commands, not keys
    for span in re.findall(r"`([^`]+)`", text):
        for part in re.split(r",\s*(?![^{]*\})", span):
            part = part.strip()
            m = re.fullmatch(r"([\w.]+)\.\{([^}]*)\}", part)
            keys = [f"{m.group(1)}.{k.strip()}" for k in m.group(2).split(",")] if m else [part]
            for k in keys:
                if k.endswith(".*"):
                    prefixes.append(k[:-1])
                else:
                    names.add(k.split(" ")[0].split(":")[0])
    return names, prefixes


def test_docs_name_every_key_of_these_files():
    names, prefixes = _named_in_docs()
    missing = set()
    for name in FILES:
        tree = load_nemo_chain(ROOT / name)
        for key in (p.rstrip(".") for p in _paths(tree)):
            parts = key.split(".")
            # A key is named itself, under a named prefix, or as a section whose keys are all listed.
            if not any(".".join(parts[:i]) in names for i in range(len(parts), 0, -1)) and \
                    not any(key.startswith(p) for p in prefixes):
                missing.add(key)
    assert not missing, sorted(missing)
