"""``grpo.adv_estimator``: every listed estimator is accepted and runs (no value listed then refused),
GDPO needs an environment with reward components, the KL-in-reward rules, one line per problem."""

from __future__ import annotations

import typing

import pytest

from rlplane.config.algorithms import GRPOAdvEstimatorConfig
from rlplane.config.loading import ConfigError, load_config


def problems(overrides):
    with pytest.raises(ConfigError) as e:
        load_config(None, list(overrides))
    return e.value.problems


@pytest.mark.parametrize("name", typing.get_args(GRPOAdvEstimatorConfig.model_fields["name"].annotation))
def test_every_listed_estimator_is_accepted(name):
    assert load_config(None, [f"grpo.adv_estimator.name={name}"]).grpo.adv_estimator.name == name


def test_opd_is_not_offered_until_a_teacher_exists():
    (line,) = problems(["grpo.adv_estimator.name=opd"])
    assert line.startswith("grpo.adv_estimator.name:") and "\n" not in line


def test_gdpo_with_an_environment_without_reward_components_is_one_line():
    """Said at start-up, where the environments are known (tests/unit/training/test_gdpo_components.py)."""
    from rlplane.training.workers import check_gdpo_components

    cfg = load_config(None, ["grpo.adv_estimator.name=gdpo", "data.dataset=guess_number"])
    with pytest.raises(ConfigError) as e:
        check_gdpo_components(cfg, ["guess_number"])
    (line,) = e.value.problems
    assert "gdpo" in line and "'guess_number'" in line and "grpo.adv_estimator.name=grpo" in line


def test_gdpo_weights_load_with_the_arithmetic_environment():
    cfg = load_config(None, ["grpo.adv_estimator.name=gdpo", "grpo.adv_estimator.reward_weights=[1.0, 0.5]"])
    assert cfg.grpo.adv_estimator.reward_weights == [1.0, 0.5]


def test_kl_in_reward_needs_reinforce_plus_plus_under_grpo():
    (line,) = problems(["loss_fn.use_kl_in_reward=true", "loss_fn.reference_policy_kl_penalty=0.01"])
    assert "grpo.adv_estimator.name=reinforce_plus_plus" in line
    load_config(None, ["loss_fn.use_kl_in_reward=true", "loss_fn.reference_policy_kl_penalty=0.01",
                       "grpo.adv_estimator.name=reinforce_plus_plus"])


def test_kl_in_reward_needs_the_reference_and_prev_logprobs():
    base = ["loss_fn.use_kl_in_reward=true", "loss_fn.reference_policy_kl_penalty=0.01",
            "grpo.adv_estimator.name=reinforce_plus_plus"]
    (line,) = problems([*base, "grpo.skip_reference_policy_logprobs_calculation=true"])
    assert "grpo.skip_reference_policy_logprobs_calculation" in line
    lines = problems([*base, "loss_fn.force_on_policy_ratio=true", "policy.train_global_batch_size=256"])
    assert any("force_on_policy_ratio skips" in x for x in lines)
