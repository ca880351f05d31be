"""The early-stop rules across their range, against hand-written validation sequences: the index of the
validation that stops the run is the one the rule says (worked out by hand below), on a fresh run and on
one resumed at every point; invalid values are refused in one line."""

import pytest

from rlplane.cli import main
from rlplane.config.loading import load_config
from rlplane.training.early_stop import EarlyStop

# Eighths and sixteenths: every sum below is exact in binary, so a tie is a tie.
RISING = [0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0]
PLATEAU = [0.5] * 8
DROP = [0.75, 0.625, 0.5, 0.375, 0.25, 0.125, 0.0, 0.0]
NOISY = [0.25, 0.375, 0.3125, 0.4375, 0.375, 0.5625, 0.5, 0.5]
SMALL, LARGE = 0.0625, 0.5

# The plateau rule: validation 0 sets the best; a validation improves when v > best + min_delta (strictly);
# otherwise it adds one to the count since the best, and the run stops when that count reaches patience.
# (sequence, min_delta) -> the stop index for patience 1, 2, 5 (None: no stop).
PLATEAU_RULE = {
    # Each rise (0.125) beats best + 0 and best + 0.0625: every validation is a new best.
    ("rising", 0.0): (None, None, None),
    ("rising", SMALL): (None, None, None),
    # best 0.125 needs > 0.625: i1..i4 miss (i4 = 0.625 ties: no), count 1..4; i5 = 0.75 is a new best (needs
    # > 1.25 after), i6, i7 count 1, 2. Patience 1: i1; 2: i2; 5: the count never reaches 5.
    ("rising", LARGE): (1, 2, None),
    # No value exceeds the first: the count is i at validation i, whatever min_delta.
    ("plateau", 0.0): (1, 2, 5),
    ("plateau", SMALL): (1, 2, 5),
    ("plateau", LARGE): (1, 2, 5),
    # Higher is better: a fall is never an improvement, so a falling metric stops as a flat one does.
    ("drop", 0.0): (1, 2, 5),
    ("drop", SMALL): (1, 2, 5),
    ("drop", LARGE): (1, 2, 5),
    # min_delta 0: best .25 -> i1 .375 best; i2 .3125 count 1; i3 .4375 best; i4 .375 count 1; i5 .5625 best;
    # i6 .5 count 1; i7 .5 count 2. Patience 1: i2; 2: i7; 5: none.
    ("noisy", 0.0): (2, 7, None),
    # min_delta 1/16: i1 .375 > .3125 best; i2 .3125 count 1; i3 .4375 ties .375 + .0625: count 2; i4 count 3;
    # i5 .5625 > .4375 best; i6, i7 count 1, 2. Patience 1: i2; 2: i3; 5: none.
    ("noisy", SMALL): (2, 3, None),
    # min_delta 0.5: nothing beats .25 + .5: the count is i at validation i.
    ("noisy", LARGE): (1, 2, 5),
}
SEQUENCES = {"rising": RISING, "plateau": PLATEAU, "drop": DROP, "noisy": NOISY}
GRID = [(name, delta, patience, stops[i]) for (name, delta), stops in PLATEAU_RULE.items()
        for i, patience in enumerate((1, 2, 5))]

# NeMo RL's threshold: the first validation with v >= threshold (reached from below; ties count).
THRESHOLD_RULE = [
    ("rising", 0.375, 2), ("rising", 0.5, 3), ("rising", 1.0, 7),  # exactly equal at i2, i3, i7
    ("noisy", 0.375, 1), ("noisy", 0.5, 5), ("noisy", 1.0, None),  # i4 = .375 < .5; i5 = .5625 the first above
    ("drop", 0.5, 0), ("drop", 1.0, None),  # met by the first validation; a falling metric never meets 1.0
    ("plateau", 0.5, 0), ("plateau", 0.5625, None),
]


def _rule(*overrides) -> EarlyStop:
    cfg = load_config(None, list(overrides))
    return EarlyStop(cfg.loop, cfg.early_stop)


def _plateau(delta, patience) -> EarlyStop:
    return _rule("early_stop.enabled=true", f"early_stop.patience={patience}", f"early_stop.min_delta={delta}")


def _threshold(threshold) -> EarlyStop:
    return _rule("grpo.stop_at_validation_metric=accuracy", f"grpo.stop_at_validation_threshold={threshold}")


def _stop_index(make, values, resume_at=None):
    """The index of the validation that stopped the run (None: none); ``resume_at``: the rule's state is
    carried into a new one (as a checkpoint does) before that validation."""
    rule = make()
    for i, v in enumerate(values):
        if i == resume_at:
            state, rule = rule.state(), make()
            rule.load_state(state)
        if rule.observe({"validation/accuracy": v}):
            return i
    return None


@pytest.mark.parametrize("name, delta, patience, expect", GRID, ids=[f"{n}-d{d:g}-p{p}" for n, d, p, _ in GRID])
def test_the_plateau_rule_stops_where_the_rule_says(name, delta, patience, expect):
    values = SEQUENCES[name]
    assert _stop_index(lambda: _plateau(delta, patience), values) == expect
    for cut in range(1, len(values)):  # a resume anywhere changes nothing
        assert _stop_index(lambda: _plateau(delta, patience), values, resume_at=cut) == expect, cut


@pytest.mark.parametrize("name, threshold, expect", THRESHOLD_RULE,
                         ids=[f"{n}-t{t:g}" for n, t, _ in THRESHOLD_RULE])
def test_the_threshold_stops_at_the_first_validation_reaching_it(name, threshold, expect):
    assert _stop_index(lambda: _threshold(threshold), SEQUENCES[name]) == expect


def test_the_stop_reason_names_the_rule_and_the_threshold_comes_first():
    rule = _rule("early_stop.enabled=true", "early_stop.patience=2", f"early_stop.min_delta={LARGE}",
                 "grpo.stop_at_validation_metric=accuracy", "grpo.stop_at_validation_threshold=0.375")
    reasons = [rule.observe({"validation/accuracy": v}) for v in RISING[:3]]
    # i2: both rules fire (two validations without beating 0.125 + 0.5; 0.375 reached): one reason, NeMo's.
    assert reasons[:2] == [None, None] and reasons[2] == "validation accuracy 0.375 reached stop_at_validation_" \
                                                         "threshold 0.375"
    rule = _plateau(SMALL, 2)
    reasons = [rule.observe({"validation/accuracy": v}) for v in NOISY[:4]]
    assert reasons[3] == ("early stop: validation accuracy has not bettered 0.375 by more than min_delta 0.0625 "
                          "in 2 validations (patience 2)")


def test_the_drop_rule_stops_at_the_first_validation_below_best_minus_max_drop():
    # best .75; .625 and .5 are not below .75 - .25 = .5 (a tie is not a fall); .375 is (i3), before patience 5.
    rule = lambda: _rule("early_stop.enabled=true", "early_stop.patience=5", "early_stop.max_drop=0.25")  # noqa: E731
    assert _stop_index(rule, DROP) == 3


@pytest.mark.parametrize("overrides, key", [
    (["early_stop.patience=-1"], "early_stop.patience"),
    (["early_stop.patience=0"], "early_stop.patience"),
    (["early_stop.patience=1.5"], "early_stop.patience"),
    (["early_stop.min_delta=-0.01"], "early_stop.min_delta"),
    (["early_stop.min_delta=nan"], "early_stop.min_delta"),
    (["early_stop.max_drop=-0.1"], "early_stop.max_drop"),
    (["early_stop.enabled=true", "early_stop.metric=acuracy"], "early_stop.metric = 'acuracy'"),
    (["early_stop.enabled=true", "early_stop.metric=pass_k"], "early_stop.metric = 'pass_k'"),
    (["grpo.stop_at_validation_metric=reward", "grpo.stop_at_validation_threshold=1"],
     "grpo.stop_at_validation_metric = 'reward'"),
    (["grpo.stop_at_validation_metric=accuracy", "grpo.stop_at_validation_threshold=nan"],
     "grpo.stop_at_validation_threshold = nan"),
], ids=lambda v: v[-1] if isinstance(v, list) else None)
def test_invalid_values_are_refused_in_one_line(overrides, key, capsys):
    assert main(["show-config", *overrides]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"rlplane: error: {key}"), err


@pytest.mark.parametrize("overrides", [
    ["early_stop.patience=1", "early_stop.min_delta=0"],
    ["early_stop.metric=validation/accuracy"],
    ["grpo.val_num_generations_per_prompt=4", "early_stop.metric=pass@4"],
    ["early_stop.metric=env/arithmetic/format_ok"],
    ["early_stop.enabled=false", "early_stop.metric=anything"],  # not watched
])
def test_the_edges_of_the_range_are_taken(overrides):
    load_config(None, ["early_stop.enabled=true", *overrides])
