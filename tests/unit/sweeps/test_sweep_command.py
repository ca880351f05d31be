"""``rlplane sweep``'s command: what it checks before the first run and what it hands each run (no real runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlplane.cli import main
from rlplane.sweeps import command, runner
from rlplane.sweeps.plan import SweepRun

NEMO_TINY = Path(__file__).resolve().parents[2] / "fixtures" / "nemo" / "grpo_math_tiny.yaml"


@pytest.fixture
def handed(monkeypatch):
    """What the sweep would run: its overrides and runs, captured instead of run."""
    seen = {}

    def fake_run_sweep(config, overrides, runs, out, **kw):
        seen.update(config=config, overrides=overrides, runs=runs, out=out)
        return []

    monkeypatch.setattr(command, "run_sweep", fake_run_sweep)
    return seen


def test_a_nemo_files_checkpoint_and_log_directories_become_each_runs_own(handed, tmp_path, capsys):
    """NeMo RL's files name shared directories (results/grpo, logs): every run of a sweep would write the same
    checkpoints and the report would find no curve. Each run keeps them in its run directory instead."""
    assert main(["sweep", "-c", str(NEMO_TINY), "data.dataset=arithmetic", "--seeds", "2", "--out",
                 str(tmp_path / "s")]) == 0
    assert handed["overrides"][-2:] == ["checkpointing.checkpoint_dir=null", "logger.log_dir=null"]
    assert "each run keeps its checkpoints and logs in its run directory" in capsys.readouterr().out
    assert main(["sweep", "--seeds", "1", "--out", str(tmp_path / "t")]) == 0  # a preset's are already the run's
    assert not any(o.endswith("dir=null") for o in handed["overrides"])


def test_an_override_after_control_is_an_override(handed, tmp_path, capsys):
    """`--control KEY=VALUE`: argparse hands the override to --control as its kind; it is read as an override."""
    assert main(["sweep", "--seeds", "1", "--control", "grpo.max_num_steps=3", "--out", str(tmp_path / "s")]) == 0
    assert "grpo.max_num_steps=3" in handed["overrides"]
    assert [r.control for r in handed["runs"]] == [None, "rewards permuted"]
    assert main(["sweep", "--seeds", "1", "--control", "grpo.reward_control=coin", "--out", str(tmp_path / "t")]) == 2
    assert "grpo.reward_control = coin makes every run of the sweep a control already" in capsys.readouterr().err


def test_every_group_is_checked_at_its_largest_seed_before_the_directory_is_claimed(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["sweep", "--seed-list", "1,18446744073709551616", "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith("rlplane: error: seed 18446744073709551616: grpo.seed:")
    assert main(["sweep", "--seeds", "1", "--variant", "fp32", "--variant", "grpo.nope=1", "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith("rlplane: error: --variant grpo.nope=1: grpo.nope: unknown key")
    assert not out.exists()


def test_a_run_without_validation_is_reported_not_a_traceback(tmp_path, monkeypatch):
    """A config that validates neither before nor after (val_at_start false): accuracies n/a, no crash."""
    def fake_run_one(config, overrides, run, out):
        (out / run.label).mkdir(parents=True)
        (out / run.label / "summary.json").write_text(json.dumps({"accuracy_before": None, "accuracy_after": None}))
        return 0, 1.0

    monkeypatch.setattr(runner, "run_one", fake_run_one)
    said = []
    out = tmp_path / "s"
    (out / "logs").mkdir(parents=True)
    results = runner.run_sweep(None, [], [SweepRun("seed1", 1, "", None, ("grpo.seed=1",), ())], out, header=["h"],
                               title="t", say=said.append)
    assert results[0].status == "done" and results[0].gain is None
    assert "[1/1] seed1: n/a -> n/a, gain n/a in 1 s" in said
