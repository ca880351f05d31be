"""PPO config: the preset, the ppo/value sections, and one-line errors for keys of the other algorithm."""

from __future__ import annotations

import pytest

from rlplane.config.loading import ConfigError, dump_config, load_config


def problems(preset=None, overrides=()):
    with pytest.raises(ConfigError) as e:
        load_config(preset, list(overrides))
    return e.value.problems


def test_ppo_preset_loads_with_its_sections_and_grpo_unset():
    cfg = load_config("ppo_arithmetic")
    assert cfg.algorithm == "ppo" and cfg.grpo is None
    assert cfg.loop is cfg.ppo and cfg.ppo.ppo_epochs >= 1
    assert cfg.ppo.adv_estimator.name == "gae" and cfg.value.loss_fn.cliprange == 0.2


def test_grpo_default_leaves_ppo_sections_unset():
    cfg = load_config()
    assert cfg.algorithm == "grpo" and cfg.ppo is None and cfg.value is None and cfg.loop is cfg.grpo


def test_dumped_configs_load_back(tmp_path):
    for preset in (None, "ppo_arithmetic"):
        path = tmp_path / "c.yaml"
        path.write_text(dump_config(load_config(preset)))
        assert load_config(str(path)) == load_config(preset)


def test_ppo_epochs_below_one_is_one_line():
    (line,) = problems("ppo_arithmetic", ["ppo.ppo_epochs=0"])
    assert line.startswith("ppo.ppo_epochs = 0:") and "set ppo.ppo_epochs >= 1" in line


def test_ppo_keys_with_grpo_are_errors():
    lines = problems(None, ["ppo.ppo_epochs=2", "value.optimizer.lr=1e-3"])
    assert lines == [
        "ppo.ppo_epochs: PPO-only keys with algorithm = grpo; remove them (or set algorithm=ppo)",
        "value.optimizer: PPO-only keys with algorithm = grpo; remove them (or set algorithm=ppo)",
    ]


def test_grpo_keys_with_ppo_are_errors_and_shared_keys_point_to_ppo():
    lines = problems("ppo_arithmetic", ["grpo.advantage_clip_low=-1", "grpo.seed=3"])
    assert len(lines) == 2
    assert lines[0] == ("grpo.seed: with algorithm = ppo the loop settings "
                        "live under ppo.*; use ppo.seed (or set algorithm=grpo)")
    assert lines[1] == ("grpo.advantage_clip_low: GRPO-only keys with "
                        "algorithm = ppo; remove them (or set algorithm=grpo)")


def test_switching_the_grpo_preset_to_ppo_names_every_misplaced_key():
    (line,) = problems(None, ["algorithm=ppo"])
    assert line.startswith("grpo.max_num_steps, ") and "use ppo.max_num_steps" in line


def test_ppo_cross_section_rules_name_the_ppo_section():
    lines = problems("ppo_arithmetic", ["ppo.num_prompts_per_step=3", "loss_fn.force_on_policy_ratio=true"])
    assert any("ppo.num_prompts_per_step × num_generations_per_prompt = 24" in line for line in lines)
    assert any("ppo.ppo_epochs" in line and "force_on_policy_ratio" in line for line in lines)


def test_value_cliprange_must_be_non_negative():
    (line,) = problems("ppo_arithmetic", ["value.loss_fn.cliprange=-0.1"])
    assert line.startswith("value.loss_fn.cliprange = -0.1")
