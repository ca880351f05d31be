"""The end-of-run line: what healthy runs of the preset gain, beside this run's gain."""

from __future__ import annotations

import pytest

from rlplane.config.loading import load_config
from rlplane.errors import ConfigError
from rlplane.sweeps.expected import changed_keys, expected_lines

FIGS = ["expected.preset=grpo_arithmetic", "expected.gain_low=0.31", "expected.gain_high=0.55", "expected.seeds=5",
        "expected.control_gain=0.01", "expected.measured_on=two CPUs"]


def _lines(overrides: list[str], gain: float | None) -> list[str]:
    cfg = load_config(None, [*FIGS, *overrides])
    shipped = load_config("grpo_arithmetic", []).model_dump(mode="json")
    return expected_lines(cfg.expected, gain, changed_keys(cfg.model_dump(mode="json"), shipped, "grpo"),
                          "grpo.seed")


def test_a_run_of_the_preset_as_shipped_is_placed_in_the_range():
    head = ("healthy runs of grpo_arithmetic gain +31 to +55 points of held-out accuracy (5 seeds on two CPUs; its "
            "control, whose rewards carry no information, +1)")
    # Seed, run_dir, logging, checkpoints and placement do not change the recipe.
    same = ["grpo.seed=7", "run_dir=/tmp/x", "logger.tensorboard_enabled=false", "checkpointing.enabled=false",
            "runtime=ray", "data_plane.backend=ray", "policy.threads_per_worker=1"]
    assert _lines(same, 0.40) == [head, "this run: +40 points, within that range"]
    assert _lines([], 0.60)[-1] == "this run: +60 points, above that range (a lucky seed, or a better recipe)"
    assert _lines([], 0.12)[-1].startswith("this run: +12 points, below that range: try another grpo.seed")
    # To the tenth where rounding would put a value inside the range it is outside of: +30.6 below +31.
    assert _lines([], 0.306)[-1].startswith("this run: +30.6 points, below that range")
    assert _lines([], None) == [head]


def test_a_changed_recipe_is_told_the_range_may_not_apply():
    lines = _lines(["grpo.max_num_steps=50", "policy.optimizer.lr=1e-3"], 0.05)
    assert lines[1] == ("this run changed policy.optimizer.lr, grpo.max_num_steps: the range is for grpo_arithmetic "
                        "as shipped")


def test_no_figures_no_lines_and_bad_figures_are_one_line():
    cfg = load_config(None, ["expected.gain_low=null", "expected.gain_high=null"])
    assert expected_lines(cfg.expected, 0.3, [], "grpo.seed") == []
    with pytest.raises(ConfigError, match="gain_low and gain_high go together"):
        load_config(None, ["expected.gain_low=0.1", "expected.gain_high=null"])
    with pytest.raises(ConfigError, match="gain_low = 0.5 > gain_high = 0.2"):
        load_config(None, ["expected.gain_low=0.5", "expected.gain_high=0.2"])


def test_distillations_control_is_named_as_a_teacher_that_learned_nothing():
    cfg = load_config("distill_arithmetic", [])
    line = expected_lines(cfg.expected, None, [], "distillation.seed", "with a teacher that learned nothing")[0]
    assert line.startswith("healthy runs of distill_arithmetic gain ")
    assert "; its control, with a teacher that learned nothing, " in line and "rewards" not in line
