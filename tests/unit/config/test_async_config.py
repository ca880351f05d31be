"""grpo.async_grpo: defaults, and what async GRPO refuses, one line each."""

from __future__ import annotations

import pytest

from rlplane.config.loading import ConfigError, load_config

ASYNC = ["grpo.async_grpo.enabled=true", "loss_fn.use_importance_sampling_correction=true"]


def problems(overrides):
    with pytest.raises(ConfigError) as e:
        load_config(None, list(overrides))
    return e.value.problems


def test_async_defaults_and_a_valid_async_config():
    a = load_config(None, []).grpo.async_grpo
    assert (a.enabled, a.max_trajectory_age_steps, a.max_generation_failures) == (False, 1, 3)
    cfg = load_config(None, [*ASYNC, "grpo.async_grpo.max_trajectory_age_steps=2"])
    assert cfg.grpo.async_grpo.enabled and cfg.grpo.async_grpo.max_trajectory_age_steps == 2


def test_async_needs_importance_sampling_correction():
    (line,) = problems(["grpo.async_grpo.enabled=true"])
    assert line.startswith("grpo.async_grpo.enabled needs loss_fn.use_importance_sampling_correction=true")
    assert line.endswith("set it to true")


def test_async_rejects_dynamic_sampling():
    (line,) = problems([*ASYNC, "grpo.use_dynamic_sampling=true"])
    assert line.startswith("grpo.use_dynamic_sampling cannot run with grpo.async_grpo.enabled")


def test_async_takes_the_forced_on_policy_ratio_of_one_step_per_rollout():
    # NeMo RL's async-1off recipes set it: with one optimizer step per rollout, π_old is the weights the step trains,
    # the forced ratio is exactly 1 and the IS weight exp(sg(log π) − log π_gen) the one async needs.
    cfg = load_config(None, [*ASYNC, "loss_fn.force_on_policy_ratio=true"])
    assert cfg.loss_fn.force_on_policy_ratio and cfg.grpo.async_grpo.enabled


def test_age_must_be_at_least_one():
    (line,) = problems([*ASYNC, "grpo.async_grpo.max_trajectory_age_steps=0"])
    assert line.startswith("grpo.async_grpo.max_trajectory_age_steps:")


def test_concurrent_scoring_defaults_to_the_age_bound_and_must_be_at_least_one():
    assert load_config(None, []).grpo.async_grpo.max_concurrent_scoring is None
    assert load_config(None, [*ASYNC]).grpo.async_grpo.scoring_concurrency() == 1  # max age 1
    age3 = load_config(None, [*ASYNC, "grpo.async_grpo.max_trajectory_age_steps=3"])
    assert age3.grpo.async_grpo.scoring_concurrency() == 3
    two = load_config(None, [*ASYNC, "grpo.async_grpo.max_trajectory_age_steps=3",
                             "grpo.async_grpo.max_concurrent_scoring=2"])
    assert two.grpo.async_grpo.max_concurrent_scoring == 2 and two.grpo.async_grpo.scoring_concurrency() == 2
    (line,) = problems([*ASYNC, "grpo.async_grpo.max_concurrent_scoring=0"])
    assert line.startswith("grpo.async_grpo.max_concurrent_scoring:") and "\n" not in line
