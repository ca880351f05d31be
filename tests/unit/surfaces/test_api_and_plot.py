"""rlplane.evaluate checks its arguments as the command does; rlplane plot reads partial or odd
metrics files and refuses bad outputs in one line; caches and checkpoints that cannot be written."""

from __future__ import annotations

import errno
import json

import pytest

import rlplane
from rlplane.cli import main
from rlplane.config.loading import ConfigError


@pytest.mark.parametrize("kwargs, message", [
    ({"num_problems": 0}, "num_problems = 0: must be an integer >= 1"),  # evaluated 16
    ({"num_problems": -5}, "num_problems = -5: must be an integer >= 1"),  # evaluated 11
    ({"k": 0}, "k = 0: must be an integer >= 1"),
    ({"batch_size": 0}, "batch_size = 0: must be an integer >= 1"),
    ({"num_problems": 2.5}, "num_problems = 2.5: must be an integer >= 1"),
    ({"checkpoint": "/nonexistent", "model": "embedded:tiny-llama"},
     "rlplane.evaluate: give model or checkpoint, not both"),  # model was dropped silently
])
def test_evaluate_refuses_what_the_command_refuses(kwargs, message):
    with pytest.raises(ConfigError) as e:
        rlplane.evaluate(**{"model": "embedded:tiny-llama", **kwargs})
    assert str(e.value) == message


def _metrics(run, rows: list[bytes]):
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "metrics.jsonl").write_bytes(b"\n".join(rows))


ROW = json.dumps({"step": 1, "train/reward": 0.5}).encode()


def test_plot_skips_a_partial_last_line_and_says_so(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    _metrics(tmp_path / "r", [ROW, json.dumps({"step": 2, "train/reward": 0.6}).encode(), b'{"step": 3, "train/re'])
    assert main(["plot", str(tmp_path / "r")]) == 0
    out = capsys.readouterr()
    assert f"{tmp_path / 'r' / 'logs' / 'metrics.jsonl'}, line 3: incomplete last line, skipped" in out.err
    assert "(2 rows)" in (tmp_path / "r" / "plot.html").read_text()


@pytest.mark.parametrize("case, expect", [
    ("not-utf8", "line 2: not UTF-8 text (byte 0xff)"),
    ("garbage-mid-file", "line 1: not a metrics row"),
    ("file-as-run-dir", "line 1: not a metrics row"),
    ("missing", "no such file or directory"),
    ("out-unknown-extension", "matplotlib cannot write '.xyz' files"),
    ("out-unwritable", "--output /proc/nope/p.png: cannot write it"),
    ("out-is-directory", "is a directory"),
])
def test_plot_mistakes_are_one_line(tmp_path, capsys, case, expect):
    pytest.importorskip("matplotlib")
    run, out = tmp_path / "r", []
    if case == "not-utf8":
        _metrics(run, [ROW, b'{"step": 2, "x": "\xff"}', ROW])
    elif case == "garbage-mid-file":
        _metrics(run, [b"{oops", ROW])
    elif case == "file-as-run-dir":
        run = tmp_path / "notes.txt"
        run.write_text("my notes\nmore\n")
    elif case != "missing":
        _metrics(run, [ROW])
        out = ["-o", {"out-unknown-extension": str(tmp_path / "p.xyz"), "out-unwritable": "/proc/nope/p.png",
                      "out-is-directory": str(tmp_path)}[case]]
    assert main(["plot", str(run), *out]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("rlplane: error:") and expect in line, line


def test_an_unwritable_model_cache_is_one_line(monkeypatch):
    from rlplane.models.packaged import PackagedModelError, packaged_model_dir

    monkeypatch.setenv("RLPLANE_CACHE_DIR", "/proc/nope")  # as a read-only HOME
    with pytest.raises(PackagedModelError, match=r"cannot write the model cache /proc/nope/models .*RLPLANE_CACHE_DIR"):
        packaged_model_dir("smollm2-135m-instruct")


def test_a_full_disk_at_checkpoint_time_is_one_line_and_leaves_no_half_checkpoint(tmp_path):
    from rlplane.utils.checkpoint import CheckpointError, CheckpointManager

    def write(d):
        (d / "part").write_text("x")
        raise OSError(errno.ENOSPC, "No space left on device")

    manager = CheckpointManager(tmp_path, None, "val:accuracy", True)
    with pytest.raises(CheckpointError, match=r"tmp_step_3: cannot write it \(No space left on device\)"):
        manager.save(3, {"step": 3}, write)
    assert list(tmp_path.iterdir()) == []


def test_a_wandb_dir_that_cannot_be_created_is_one_line(tmp_path):
    pytest.importorskip("wandb")
    from rlplane.config.loading import load_config
    from rlplane.utils.trackers import WandbSink

    cfg = load_config(None, ["logger.wandb.dir=/proc/nope/wandb"]).logger.wandb
    with pytest.raises(ConfigError, match=r"logger.wandb.dir = '/proc/nope/wandb': cannot create it"):
        WandbSink(cfg, "run", tmp_path, {})
