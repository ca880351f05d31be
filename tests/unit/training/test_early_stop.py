"""The early-stop rules on a sequence of validations: NeMo RL's threshold (metric >= threshold, checked at
every validation), the plateau rule (no new best by more than min_delta in `patience` validations), the
drop rule (below best - max_drop), their config checks, the state a checkpoint carries, and the CLI flag."""

import pytest

from rlplane.cli import build_parser
from rlplane.config.loading import load_config
from rlplane.errors import ConfigError
from rlplane.training.early_stop import EarlyStop


def _stop(*overrides):
    cfg = load_config(None, list(overrides))
    return EarlyStop(cfg.loop, cfg.early_stop)


def _first_stop(rule, values, key="validation/accuracy"):
    """(index of the validation that stopped the run, its reason), or (None, None)."""
    for i, v in enumerate(values):
        if reason := rule.observe({key: v}):
            return i, reason
    return None, None


def test_nothing_stops_by_default():
    assert _first_stop(_stop(), [0.5, 0.1, 0.1, 0.1, 0.1, 0.0]) == (None, None)


def test_nemo_threshold_stops_at_the_first_validation_reaching_it():
    rule = _stop("grpo.stop_at_validation_metric=accuracy", "grpo.stop_at_validation_threshold=0.6")
    i, reason = _first_stop(rule, [0.2, 0.59, 0.6, 0.9])
    assert i == 2 and "reached stop_at_validation_threshold 0.6" in reason
    rule = _stop("grpo.val_num_generations_per_prompt=4", "grpo.stop_at_validation_metric=pass@4",
                 "grpo.stop_at_validation_threshold=0.5")
    assert _first_stop(rule, [0.2, 0.7], key="validation/pass@4")[0] == 1


def test_threshold_needs_both_keys():
    with pytest.raises(ConfigError, match="stop_at_validation_metric and stop_at_validation_threshold go together"):
        load_config(None, ["grpo.stop_at_validation_metric=accuracy"])


@pytest.mark.parametrize("values, patience, min_delta, expect", [
    ([0.2, 0.3, 0.3, 0.3, 0.3], 3, 0.0, 4),  # best 0.3 at index 1, three equal ones after it
    ([0.2, 0.3, 0.3, 0.4, 0.4, 0.4], 3, 0.0, None),  # the new best at index 3 restarts the count
    ([0.2, 0.25, 0.28, 0.29], 3, 0.1, 3),  # gains within min_delta are no improvement
    ([0.2, 0.1], 1, 0.0, 1),
])
def test_plateau_rule(values, patience, min_delta, expect):
    rule = _stop("early_stop.enabled=true", f"early_stop.patience={patience}", f"early_stop.min_delta={min_delta}")
    i, reason = _first_stop(rule, values)
    assert i == expect
    if expect is not None:
        assert f"in {patience} validations (patience {patience})" in reason


def test_drop_rule_stops_at_once():
    rule = _stop("early_stop.enabled=true", "early_stop.patience=10", "early_stop.max_drop=0.1")
    i, reason = _first_stop(rule, [0.3, 0.5, 0.45, 0.39, 0.6])
    assert i == 3 and "fell more than max_drop 0.1 below the best 0.5" in reason


def test_state_carries_over_a_resume():
    rule = _stop("early_stop.enabled=true", "early_stop.patience=2")
    _first_stop(rule, [0.5, 0.4])
    resumed = _stop("early_stop.enabled=true", "early_stop.patience=2")
    resumed.load_state(rule.state())
    assert resumed.observe({"validation/accuracy": 0.45}) is not None  # the second validation without a new best


def test_missing_metric_is_no_validation():
    rule = _stop("early_stop.enabled=true", "early_stop.patience=1", "early_stop.metric=env/arithmetic/x")
    assert _first_stop(rule, [0.1, 0.0, 0.0]) == (None, None)  # only accuracy logged


def test_cli_flag():
    args = build_parser().parse_args(["train", "--early-stop", "early_stop.patience=5"])
    assert args.early_stop and args.overrides == ["early_stop.patience=5"]
    assert not build_parser().parse_args(["train"]).early_stop
