"""``rlplane sweep`` end to end on a tiny config: ordinary run directories, a control, a report, and an interrupted
sweep that continues where it stopped."""

from __future__ import annotations

import json
import shutil

from rlplane.cli import main
from tests.tiny import TINY_RUN

TINY = [*TINY_RUN, "grpo.val_at_start=true", "grpo.val_period=1", "checkpointing.enabled=false"]


def test_a_sweep_runs_seeds_and_a_control_and_continues_after_an_interruption(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", "--seeds", "2", "--control", "--out", str(out), *TINY]) == 0
    printed = capsys.readouterr().out
    for label in ("seed1", "seed2", "seed1-control"):
        summary = json.loads((out / label / "summary.json").read_text())  # an ordinary run directory
        assert summary["accuracy_before"] is not None and (out / "logs" / f"{label}.log").is_file()
    assert "grpo.reward_control: permute" not in (out / "seed1" / "config.yaml").read_text()
    assert "reward_control: permute" in (out / "seed1-control" / "config.yaml").read_text()
    assert "seed: 2" in (out / "seed2" / "config.yaml").read_text()
    results = json.loads((out / "results.json").read_text())
    assert [g["group"] for g in results["groups"]] == ["as configured", "control (rewards permuted)"]
    assert results["groups"][0]["n"] == 2 and "as configured: 2 runs, gain" in printed
    assert "machine: " in (out / "sweep.md").read_text()

    # An interrupted sweep: seed2 cut short (no summary), seed3 never started. The same command with one seed
    # more redoes seed2, runs seed3 and keeps seed1 and the control.
    first = (out / "seed1" / "summary.json").stat().st_mtime_ns
    (out / "seed2" / "summary.json").unlink()
    shutil.rmtree(out / "seed1-control")
    assert main(["sweep", "--seeds", "3", "--out", str(out), *TINY]) == 0
    printed = capsys.readouterr().out
    assert "[1/3] seed1: finished earlier" in printed and "[2/3] seed2: running" in printed
    assert (out / "seed1" / "summary.json").stat().st_mtime_ns == first
    assert (out / "seed3" / "summary.json").is_file() and not (out / "seed1-control").exists()
