"""A GRPO run that a validation ends: the plateau rule after two validations without a new best (the
last step checkpointed, the summary says why), NeMo RL's threshold met by the validation before the
first step (no step runs), and ``rlplane train --early-stop`` saying why in one line."""

from __future__ import annotations

import json

from rlplane.cli import main
from rlplane.config.loading import load_config
from rlplane.recipes.grpo import train
from rlplane.utils.logging import read_metrics
from tests.tiny import TINY_RUN

SHORT = ["grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=4", "policy.train_global_batch_size=16",
         "policy.train_micro_batch_size=16", "policy.logprob_batch_size=16", "grpo.max_num_steps=6",
         "grpo.val_period=1", "grpo.max_val_samples=8", "grpo.val_batch_size=8", "warmup.enabled=false",
         "logger.progress_bar=false", "logger.tensorboard_enabled=false", "checkpointing.save_period=100"]


def test_plateau_stops_the_run_and_checkpoints_its_last_step(tmp_path):
    # min_delta 1: no accuracy can better the first validation's by more than 1, so every later one counts.
    cfg = load_config(None, [*SHORT, f"run_dir={tmp_path}", "early_stop.enabled=true", "early_stop.patience=2",
                             "early_stop.min_delta=1.0"])
    summary = train(cfg, quiet=True)
    assert [r["step"] for r in read_metrics(tmp_path / "logs")] == [0, 1, 2]
    assert summary["stopped_early"]["after_step"] == 2 and "patience 2" in summary["stopped_early"]["reason"]
    assert json.loads((tmp_path / "summary.json").read_text())["stopped_early"]["after_step"] == 2
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith("step_")) == ["step_2"]


def test_threshold_met_at_start_runs_no_step(tmp_path):
    cfg = load_config(None, [*SHORT, f"run_dir={tmp_path}", "grpo.stop_at_validation_metric=accuracy",
                             "grpo.stop_at_validation_threshold=0.0"])
    summary = train(cfg, quiet=True)
    assert [r["step"] for r in read_metrics(tmp_path / "logs")] == [0]
    assert summary["stopped_early"]["after_step"] == 0


TINY = [*TINY_RUN, "grpo.max_num_steps=6", "grpo.val_period=1", "checkpointing.save_period=100"]


def test_the_early_stop_flag_ends_a_run_and_says_why_in_one_line(tmp_path, capsys):
    # Patience 1, min_delta 1: step 1's validation sets the best, step 2's cannot better it: 2 of 6 steps run.
    rc = main(["train", "--quiet", "--early-stop", *TINY, f"run_dir={tmp_path}", "early_stop.patience=1",
               "early_stop.min_delta=1"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    why = [line for line in out if "early stop" in line]
    assert len(why) == 1 and why[0].startswith("stopped early after step 2: early stop: validation accuracy has "
                                               "not bettered "), out
    assert why[0].endswith(" by more than min_delta 1 in 1 validations (patience 1)")
    assert [r["step"] for r in read_metrics(tmp_path / "logs")] == [1, 2]
