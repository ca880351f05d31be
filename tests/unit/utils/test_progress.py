"""The console progress line carries the learning diagnostics of the step (compact, only those logged)."""

import io

from rlplane.utils.progress import Progress

STEP = {"train/reward": 0.5, "train/approx_entropy": 0.4123, "train/clip_fraction": 0.0215,
        "train/kl_penalty": 0.00123, "train/mean_gen_tokens_per_sample": 31.25, "train/reward_std_in_group": 0.321,
        "train/equal_reward_groups": 0.25}


def _line(metrics, step=1):
    out = io.StringIO()
    p = Progress(4, "grpo", every=1, bar=False, stream=out)
    p.update(step, metrics)
    return out.getvalue().strip()


def test_plain_line_has_every_diagnostic():
    parts = _line({**STEP, "validation/accuracy": 0.7}).split(" | ")
    assert parts[:4] == ["grpo step 1/4", "reward 0.500", "val_acc 0.700",
                         "ent 0.412 clip 0.0215 kl 0.00123 len 31.2 rstd 0.321 eq 0.25"]
    assert parts[4].endswith("s/step")


def test_only_the_logged_diagnostics_appear():
    parts = _line({"train/reward": 0.5, "train/approx_entropy": 1.0}).split(" | ")
    assert parts[1:3] == ["reward 0.500", "ent 1"] and parts[3].endswith("s/step")


def test_validation_line_shows_the_answer_spread():
    parts = _line({"train/reward": 0.5, "validation/accuracy": 0.52, "validation/top_answer_share": 1.0,
                   "validation/constant_answer_accuracy": 0.52}).split(" | ")
    assert parts[1:5] == ["reward 0.500", "val_acc 0.520", "val_top 1.000", "val_const 0.520"]
