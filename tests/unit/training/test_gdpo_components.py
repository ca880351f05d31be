"""GDPO normalises each reward component: an environment with fewer than two is one line at start-up, where the
environments are known (the config sits below them), user tasks registered by then included."""

from __future__ import annotations

import pytest

from rlplane.config.loading import load_config
from rlplane.errors import ConfigError
from rlplane.training.workers import check_gdpo_components

GDPO = ["grpo.adv_estimator.name=gdpo"]


def test_an_environment_without_two_components_is_refused():
    cfg = load_config(None, [*GDPO, "data.dataset=guess_number"])
    with pytest.raises(ConfigError) as e:
        check_gdpo_components(cfg, ["guess_number"])
    assert str(e.value) == ("grpo.adv_estimator.name = gdpo: environment 'guess_number' gives 0 reward components "
                            "[], GDPO needs at least 2 (task 'arithmetic' gives correct and format); use such an "
                            "environment or set grpo.adv_estimator.name=grpo")


def test_arithmetic_and_other_estimators_pass():
    check_gdpo_components(load_config(None, GDPO), ["arithmetic"])
    check_gdpo_components(load_config(None, ["data.dataset=guess_number"]), ["guess_number"])  # grpo: not asked
    check_gdpo_components(load_config(None, GDPO), ["no_such_task"])  # unknown: the task-name check says so
