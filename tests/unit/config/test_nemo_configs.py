"""NeMo RL's configs (tests/fixtures/nemo: its GRPO, PPO, distillation, tq_simple and async-1off
examples at their shipped sizes) load through ``rlplane.config.nemo``: ``defaults:`` chains, ``${...}``
interpolation, NeMo's key names mapped, NeMo-only features noted when off and refused when on, one line
each. tests/functional/test_nemo_recipes.py trains them."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlplane.config.loading import ConfigError, load_config
from rlplane.config.nemo_yaml import resolve_interpolations

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nemo"
LOCAL = ["policy.model_name=embedded:tiny-llama", "data.dataset=arithmetic", "policy.generation.backend=hf"]


GRPO, RECIPE, TQ_SIMPLE, ASYNC_1OFF = ("grpo_math_1B", "grpo-llama3.2-1b-instruct-1n1g",
                                      "grpo-llama3.2-1b-instruct-1n1g-tq_simple", "grpo-math-1B-async-1off")
PPO, DISTILLATION = "ppo_math_1B", "distillation_math"


def _load(name: str, *overrides: str):
    return load_config(str(FIXTURES / f"{name}.yaml"), [*LOCAL, *overrides])


def test_grpo_defaults_chain_interpolation_and_key_mapping(capsys):
    cfg = _load(RECIPE)
    err = capsys.readouterr().err
    assert "read as NeMo RL format" in err.splitlines()[0]
    g, p = cfg.grpo, cfg.policy
    assert cfg.algorithm == "grpo" and g.num_prompts_per_step == 64 and p.train_global_batch_size == 1024  # the layer
    assert g.num_generations_per_prompt == 16 and g.max_num_steps == 500  # the base, then the layer
    # grpo.use_leave_one_out_baseline set in the layer reaches the estimator through ${grpo.use_leave_one_out_baseline}
    assert g.adv_estimator.use_leave_one_out_baseline is False and g.adv_estimator.normalize_rewards is True
    assert p.logprob_batch_size == 4  # ${policy.train_micro_batch_size}
    assert p.sequence_packing.enabled and p.sequence_packing.train_mb_tokens == 512 * 4  # ${mul:...}
    assert (p.optimizer.lr, p.optimizer.weight_decay, p.optimizer.betas) == (5e-6, 0.01, (0.9, 0.999))
    assert (p.scheduler.warmup_steps, p.scheduler.warmup_start_factor) == (50, 0.1)  # LinearLR -> ConstantLR
    assert p.precision == "bf16" and p.device == "auto" and not cfg.warmup.enabled
    assert p.generation.max_new_tokens == 256 and "max_new_tokens = 512" in err  # NeMo's = max_total, noted
    assert cfg.loss_fn.reference_policy_kl_penalty == 0.01 and cfg.env.math.num_workers == 8
    assert cfg.checkpointing.checkpoint_dir == "results/grpo-llama3.2-1b-instruct-1n1g"
    assert cfg.run_dir == "runs/grpo-llama3.2-1b-instruct-1n1g"  # named after the file; run_dir=... sets it
    assert "policy.{megatron_cfg (Megatron-Core training)" in err  # an off feature: one note for its section


def test_rlplane_presets_and_files_stay_rlplane(tmp_path, capsys):
    own = tmp_path / "mine.yaml"
    own.write_text("defaults: grpo_arithmetic\ngrpo: {max_num_steps: 7}\n")
    assert load_config(str(own), []).grpo.max_num_steps == 7
    assert load_config(None, []).algorithm == "grpo"
    assert "NeMo" not in capsys.readouterr().err


def test_tq_simple_layer_reads_as_rlplane_data_plane(capsys):
    cfg = _load(TQ_SIMPLE)
    assert cfg.data_plane.backend == "memory" and cfg.grpo.num_prompts_per_step == 64  # two defaults: levels
    assert "data_plane.enabled: rlplane's steps always run through its data plane" in capsys.readouterr().err


def test_async_one_off():
    cfg = _load(ASYNC_1OFF)
    a = cfg.grpo.async_grpo
    assert a.enabled and a.max_trajectory_age_steps == 1 and not a.in_flight_weight_updates
    assert cfg.loss_fn.use_importance_sampling_correction and not cfg.policy.generation.colocated.enabled


def test_ppo_value_loss_and_critic():
    cfg = _load(PPO)
    assert cfg.algorithm == "ppo" and cfg.ppo.ppo_epochs == 4 and cfg.ppo.batch_multiplier == 1
    assert (cfg.value.loss_fn.scale, cfg.value.loss_fn.cliprange) == (0.4, 0.2)  # value_loss_fn -> value.loss_fn
    assert cfg.value.optimizer.lr == 1e-5 and cfg.ppo.reward_scaling.target_min == -1.0
    assert cfg.policy.precision == "fp32" and cfg.ppo.skip_reference_policy_logprobs_calculation


def test_distillation_anchors_and_relative_interpolation(capsys):
    cfg = _load(DISTILLATION)
    assert cfg.algorithm == "distillation" and cfg.teacher.model_name == "Qwen/Qwen3-4B"
    assert not cfg.warmup.enabled and not cfg.teacher.warmup.enabled  # NeMo RL has no warm-up stage
    assert cfg.policy.dynamic_batching.train_mb_tokens == 8192 * 1  # ${mul:${..max_total_sequence_length}, ...}
    assert cfg.policy.generation.max_new_tokens == 4096  # ${..max_total_sequence_length}, halved with a note
    assert cfg.distillation.topk_logits_k == 64 and cfg.loss_fn.kl_type == "reverse"  # NeMo RL's top-k reverse KL


def test_nemo_only_features_that_are_on_are_refused_one_line_each():
    on = ["policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.custom_parallel_plan=my.plan",
          "grpo.val_start_at=5", "grpo.batch_multiplier=1.5",
          "grpo.async_grpo.recompute_kv_cache_after_weight_updates=true", "data_plane.backend=mooncake_cpu",
          "policy.generation.backend=sglang"]
    with pytest.raises(ConfigError) as e:
        load_config(str(FIXTURES / f"{GRPO}.yaml"), [*LOCAL, *on])
    problems = e.value.problems
    for key in [o.split("=")[0] for o in on]:
        lines = [p for p in problems if p.startswith(key + " = ")]
        assert len(lines) == 1, (key, problems)
    assert len(problems) == len(on)
    assert any("policy.dtensor_cfg (FSDP2)" in p for p in problems if p.startswith("policy.dtensor_cfg.custom"))
    assert any("hf (transformers) or vllm" in p for p in problems if p.startswith("policy.generation.backend"))


def test_keys_rlplane_refused_before_are_read():
    """Each of these NeMo keys was an `unknown key` error before; now mapped, or noted when off."""
    cfg = _load(GRPO, "grpo.normalize_rewards=false", "grpo.calculate_advantages_on_gpu=true",
                "grpo.async_grpo.max_generation_failures=0", "grpo.batch_multiplier=1.0")
    assert cfg.grpo.adv_estimator.normalize_rewards is False  # interpolated after the override, as NeMo RL does
    ppo = _load(PPO, "value_loss_fn.scale=0.5")
    assert ppo.value.loss_fn.scale == 0.5


def test_unknown_keys_stay_errors():
    with pytest.raises(ConfigError, match=r"grpo\.not_a_nemo_key: unknown key"):
        _load(GRPO, "grpo.not_a_nemo_key=1")


def test_hydra_override_prefixes():
    cfg = _load(GRPO, "++grpo.max_num_steps=3", "+policy.activation_checkpointing=true", "~policy.draft")
    assert cfg.grpo.max_num_steps == 3 and cfg.policy.activation_checkpointing


def test_response_dataset_from_a_local_jsonl(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1+1=", "expected": "2"}\n')
    cfg = load_config(str(FIXTURES / f"{GRPO}.yaml"), [
        "policy.model_name=embedded:tiny-llama", "policy.generation.backend=hf", f"data.train.data_path={data}",
        "data.train.dataset_name=ResponseDataset", "data.train.input_key=question", "data.train.output_key=expected",
        "data.default.prompt_file=null"])
    assert cfg.data.dataset == "jsonl" and cfg.data.train.path == str(data)
    assert (cfg.data.train.problem_key, cfg.data.train.answer_key, cfg.data.prompt.processor) == (
        "question", "expected", "math")
    assert cfg.data.prompt.template == "{problem}"  # prompt_file null: NeMo RL's processor formats no prompt


def test_a_registry_dataset_reads_by_name():
    cfg = load_config(str(FIXTURES / f"{GRPO}.yaml"), ["policy.model_name=embedded:tiny-llama",
                                                       "policy.generation.backend=hf", "data.default.prompt_file=null"])
    train = cfg.data.train
    assert cfg.data.dataset == "registry" and cfg.data.validation is None
    assert (train.name, train.split_validation_size, train.seed, train.default_task_name) == (
        "OpenMathInstruct-2", 0.05, 42, "math")  # held out as NeMo RL holds it out; scored by env.math


def test_multimodal_and_unknown_dataset_names_are_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        load_config(str(FIXTURES / f"{GRPO}.yaml"), [*LOCAL[:1], "data.train.dataset_name=clevr-cogent",
                                                     "data.validation.dataset_name=nope"])
    assert [p.split(":")[0] for p in e.value.problems] == ["data.train.dataset_name = 'clevr-cogent'",
                                                           "data.validation.dataset_name = 'nope'"]
    assert "multimodal" in e.value.problems[0] and "not a NeMo RL dataset name" in e.value.problems[1]


def test_show_config_prints_the_rlplane_config_it_became(tmp_path, capsys):
    from rlplane.cli import main

    assert main(["show-config", "--config", str(FIXTURES / f"{PPO}.yaml"), *LOCAL]) == 0
    out = capsys.readouterr()
    assert "read as NeMo RL format" in out.err
    dumped = tmp_path / "rlplane.yaml"
    dumped.write_text(out.out)
    back = load_config(str(dumped), [])
    assert "NeMo" not in capsys.readouterr().err  # rlplane's own format
    assert back == _load(PPO)


def test_interpolation_resolver():
    tree = {"a": {"b": 2, "c": "${mul:${a.b}, 3}", "d": "x-${.b}", "e": "${max:${a.b}, 5}"}, "f": "${a.c}"}
    assert resolve_interpolations(tree) == {"a": {"b": 2, "c": 6, "d": "x-2", "e": 5}, "f": 6}
    with pytest.raises(ConfigError, match="interpolation cycle"):
        resolve_interpolations({"a": "${b}", "b": "${a}"})
    with pytest.raises(ConfigError, match=r"x: interpolation \$\{nope\} names no key"):
        resolve_interpolations({"x": "${nope}"})


def test_vllm_named_by_the_file_reads_as_hf_where_vllm_is_not_installed(monkeypatch, capsys):
    import rlplane.config.nemo as nemo

    monkeypatch.setattr(nemo, "vllm_available", lambda: False)
    cfg = load_config(str(FIXTURES / f"{GRPO}.yaml"), LOCAL[:2])
    assert cfg.policy.generation.backend == "hf"
    assert "backend = vllm: vllm is not installed in this Python: read as hf" in capsys.readouterr().err
    monkeypatch.setattr(nemo, "vllm_available", lambda: True)
    tree, notes, errors = nemo.translate({"policy": {"generation": {"backend": "vllm"}}})
    assert tree["policy"]["generation"]["backend"] == "vllm" and not errors


def test_show_config_of_a_recipe_given_as_a_nemo_user_gives_it(tmp_path, capsys):
    """The model by name (its tokenizer follows through ${policy.model_name}), a local ResponseDataset,
    no prompt file, sizes for a CPU: show-config prints the rlplane config, which loads back the same."""
    from rlplane.cli import main

    data = tmp_path / "local.jsonl"
    data.write_text('{"question": "1+1=", "expected": "2"}\n')
    args = ["show-config", "--config", str(FIXTURES / f"{TQ_SIMPLE}.yaml"), "policy.model_name=embedded:tiny-llama",
            "data.train.dataset_name=ResponseDataset", f"data.train.data_path={data}", "data.train.input_key=question",
            "data.train.output_key=expected", "data.default.prompt_file=null", "policy.max_total_sequence_length=128",
            "policy.generation.max_new_tokens=16", "policy.generation.backend=hf"]
    assert main(args) == 0
    out = capsys.readouterr()
    assert "read as NeMo RL format" in out.err and "tokenizer" not in out.out
    dumped = tmp_path / "rlplane.yaml"
    dumped.write_text(out.out)
    back = load_config(str(dumped), [])
    assert back.policy.model_name == "embedded:tiny-llama" and back.data.train.path == str(data)
    assert back.policy.sequence_packing.train_mb_tokens == 128 * 4  # ${mul:...} after the override
    assert back.policy.generation.max_new_tokens == 16
    assert back.data.prompt.template == "{problem}"  # no prompt file: the problem as is, as NeMo RL formats it


_WARM = {"name": "torch.optim.lr_scheduler.LinearLR", "kwargs": {"start_factor": 0.1, "end_factor": 1.0,
                                                                 "total_iters": 50}}


@pytest.mark.parametrize("stages, expected", [
    # warm-up then constant (NeMo RL's recipes)
    ([_WARM, {"name": "torch.optim.lr_scheduler.ConstantLR", "kwargs": {"factor": 1.0}}, {"milestones": [50]}],
     {"warmup_steps": 50, "warmup_start_factor": 0.1, "decay": "constant"}),
    # warm-up then cosine to eta_min = 5e-7 = 0.1 · lr (5e-6)
    ([_WARM, {"name": "CosineAnnealingLR", "kwargs": {"T_max": 450, "eta_min": 5e-7}}, {"milestones": [50]}],
     {"warmup_steps": 50, "decay": "cosine", "decay_steps": 450, "min_lr_factor": pytest.approx(0.1)}),
    # cosine alone, to 0
    ([{"name": "torch.optim.lr_scheduler.CosineAnnealingLR", "kwargs": {"T_max": 100}}],
     {"warmup_steps": 0, "decay": "cosine", "decay_steps": 100, "min_lr_factor": 0.0}),
    # a linear fall from 1 to 0.25 over 200, after the warm-up
    ([_WARM, {"name": "LinearLR", "kwargs": {"start_factor": 1.0, "end_factor": 0.25, "total_iters": 200}},
      {"milestones": [50]}],
     {"warmup_steps": 50, "decay": "linear", "decay_steps": 200, "min_lr_factor": 0.25}),
])
def test_nemo_schedules_translate_to_warm_up_and_decay(tmp_path, stages, expected):
    import yaml

    f = tmp_path / "nemo.yaml"
    f.write_text(yaml.safe_dump({"defaults": str(FIXTURES / "grpo_math_1B.yaml"),
                                 "policy": {"scheduler": stages}}))
    sch = load_config(str(f), LOCAL).policy.scheduler
    assert {k: getattr(sch, k) for k in expected} == expected


@pytest.mark.parametrize("stages", [
    [_WARM, {"name": "CosineAnnealingLR", "kwargs": {"T_max": 450}}, {"milestones": [40]}],  # starts mid-warm-up
    [{"name": "StepLR", "kwargs": {"step_size": 10}}],
    [_WARM, {"name": "ExponentialLR", "kwargs": {"gamma": 0.99}}, {"milestones": [50]}],
])
def test_nemo_schedules_without_an_equal_are_refused_in_one_line(tmp_path, stages):
    import yaml

    f = tmp_path / "nemo.yaml"
    f.write_text(yaml.safe_dump({"defaults": str(FIXTURES / "grpo_math_1B.yaml"),
                                 "policy": {"scheduler": stages}}))
    with pytest.raises(ConfigError, match=r"policy.scheduler = \[.*\]: rlplane's schedule is a linear warm-up"):
        load_config(str(f), LOCAL)
