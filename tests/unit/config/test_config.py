"""Config loading: presets, overrides, and every user mistake reported at once, one line each."""

from __future__ import annotations

import pytest

from rlplane.config.loading import ConfigError, apply_overrides, load_config, load_yaml_tree


def problems(preset=None, overrides=()):
    with pytest.raises(ConfigError) as e:
        load_config(preset, list(overrides))
    return e.value.problems


def test_default_preset_loads_and_overrides_apply():
    cfg = load_config(None, ["grpo.num_prompts_per_step=16", "policy.train_global_batch_size=128"])
    assert cfg.grpo.num_prompts_per_step == 16
    assert cfg.policy.train_global_batch_size == 128
    assert cfg.policy.model_name == "embedded:tiny-llama"


def test_override_values_are_parsed_as_yaml():
    tree = apply_overrides({}, ["a.b=1e-4", "a.c=true", "a.d=[x, y]", "a.e=null", "a.f=hello"])
    assert tree == {"a": {"b": 1e-4, "c": True, "d": ["x", "y"], "e": None, "f": "hello"}}


def test_unknown_key_names_path_and_closest_valid_key():
    (line,) = problems(overrides=["grpo.num_prompt_per_step=3"])
    assert line == "grpo.num_prompt_per_step: unknown key; did you mean grpo.num_prompts_per_step?"


def test_every_error_is_reported_at_once():
    lines = problems(overrides=["grpo.bogus=1", "policy.optimizer.lr=-1", "grpo.num_generations_per_prompt=abc"])
    assert len(lines) == 3
    assert any(line.startswith("grpo.bogus: unknown key") for line in lines)
    assert any(line.startswith("policy.optimizer.lr:") and "greater than 0" in line for line in lines)
    assert any(line.startswith("grpo.num_generations_per_prompt:") and "'abc'" in line for line in lines)


def test_invalid_combination_is_one_line_naming_keys():
    (line,) = problems(overrides=["policy.train_global_batch_size=100"])
    assert "policy.train_global_batch_size = 100" in line and "divisor" in line


def test_dp_size_needs_ray_runtime():
    lines = problems(overrides=["policy.dp_size=2", "policy.train_global_batch_size=256"])
    assert any("policy.dp_size = 2 needs runtime: ray" in line for line in lines)


def test_a_driver_held_data_plane_index_needs_the_ray_backend_and_no_async_collector():
    (line,) = problems(overrides=["data_plane.index=driver"])
    assert line.startswith("data_plane.index = driver needs data_plane.backend = ray")
    lines = problems(overrides=["data_plane.backend=ray", "data_plane.index=driver", "grpo.async_grpo.enabled=true"])
    assert any(line.startswith("data_plane.index = driver with grpo.async_grpo.enabled") for line in lines)
    assert load_config(None, ["data_plane.backend=ray", "data_plane.index=driver"]).data_plane.index == "driver"


def test_loss_rule_is_reported_with_its_section():
    lines = problems(overrides=["loss_fn.ratio_clip_c=0.5"])
    assert len(lines) == 1 and "ratio_clip_c" in lines[0]


def test_unknown_preset_lists_presets():
    (line,) = problems(preset="no_such_preset")
    assert "no such file or preset" in line and "grpo_arithmetic" in line


def test_preset_inheritance(tmp_path):
    child = tmp_path / "child.yaml"
    child.write_text("defaults: grpo_arithmetic\ngrpo:\n  max_num_steps: 7\n")
    tree = load_yaml_tree(str(child))
    assert tree["grpo"]["max_num_steps"] == 7
    assert tree["grpo"]["num_prompts_per_step"] == 32  # inherited
    assert load_config(str(child)).grpo.max_num_steps == 7


def test_bad_yaml_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("grpo:\n  a: [1, 2\n")
    (line,) = problems(preset=str(bad))
    assert str(bad) in line and "not valid YAML" in line


def test_config_is_frozen():
    cfg = load_config()
    with pytest.raises(Exception):
        cfg.grpo.num_prompts_per_step = 3


@pytest.mark.parametrize("override, key", [
    ("policy.generation.verify_probe_every=true", "policy.generation.verify_probe_every"),  # int: would be 1
    ("grpo.max_num_steps=false", "grpo.max_num_steps"),  # int: would be 0
    ("policy.optimizer.lr=true", "policy.optimizer.lr"),  # float: would be 1.0
    ("policy.generation.top_k=true", "policy.generation.top_k"),  # int | None
])
def test_true_or_false_for_a_number_is_one_line(override, key):
    with pytest.raises(ConfigError, match=rf"^{key}: true/false where a number is expected; give a number"):
        load_config(None, [override])


def test_true_and_false_stay_fine_where_a_switch_is_expected():
    cfg = load_config(None, ["policy.dynamic_batching.enabled=false", "grpo.val_at_start=true"])
    assert cfg.policy.dynamic_batching.enabled is False and cfg.grpo.val_at_start is True
