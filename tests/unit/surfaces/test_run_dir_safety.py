"""The run directory is the run's alone: a lock held for its life, and --overwrite deletes only what an
earlier rlplane run wrote there (its manifest), saying each path."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from rlplane.cli import main
from rlplane.config.loading import ConfigError
from rlplane.utils.run_dir import LOCK_FILE, MANIFEST_FILE, RunLock, prepare_run_paths, release_run_dir
from tests.tiny import TINY_RUN, tiny_cfg

ONE_STEP = ("grpo.max_num_steps=1", "grpo.val_at_end=false")
TINY = [*TINY_RUN, *ONE_STEP]


def _hold_in_child(run_dir):
    """Another process that takes the run directory's lock and waits on stdin."""
    code = textwrap.dedent(f"""
        import sys
        from rlplane.utils.run_dir import RunLock
        RunLock({str(run_dir)!r}).acquire()
        print("held", flush=True)
        sys.stdin.read()
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=env)
    assert child.stdout.readline().strip() == "held"
    return child


def test_a_second_run_in_a_locked_run_dir_is_refused_naming_the_holder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    child = _hold_in_child(run)
    try:
        with pytest.raises(ConfigError) as e:
            prepare_run_paths(tiny_cfg(run, *ONE_STEP))
        (line,) = str(e.value).splitlines()
        assert f"pid {child.pid} on host {socket.gethostname()}" in line and "another rlplane run" in line
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    # The holder is gone (the OS dropped its lock): the run may start; the stale lock file does not block it.
    paths = prepare_run_paths(tiny_cfg(run, *ONE_STEP))
    assert json.loads((run / LOCK_FILE).read_text())["pid"] == os.getpid()
    release_run_dir(paths.run_dir)


def test_the_lock_goes_with_a_killed_process(tmp_path):
    child = _hold_in_child(tmp_path)
    child.kill()
    child.wait(timeout=30)
    with RunLock(tmp_path):  # kill -9 left the file, not the lock
        pass


def test_the_lock_is_reentrant_in_one_process_and_released_at_the_end(tmp_path):
    outer = RunLock(tmp_path).acquire()
    inner = RunLock(tmp_path).acquire()  # the CLI, then the session, for one run
    inner.release()
    child_code = f"from rlplane.utils.run_dir import RunLock; RunLock({str(tmp_path)!r}).acquire()"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    assert subprocess.run([sys.executable, "-c", child_code], env=env, capture_output=True).returncode != 0
    outer.release()
    assert subprocess.run([sys.executable, "-c", child_code], env=env, capture_output=True).returncode == 0


def test_overwrite_never_deletes_the_users_own_config_yaml(tmp_path, capsys, monkeypatch):
    """run_dir=. in a directory holding the user's config.yaml: refused with or without --overwrite."""
    (tmp_path / "config.yaml").write_text("my: own config\n")
    monkeypatch.chdir(tmp_path)
    for extra in ([], ["--overwrite"]):
        assert main(["train", "--quiet", *extra, *TINY, "run_dir=."]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert f"run_dir = {str(tmp_path)!r}: holds config.yaml, which no earlier rlplane run there wrote" in line
        assert (tmp_path / "config.yaml").read_text() == "my: own config\n"


def test_overwrite_of_another_runs_checkpoints_is_refused_naming_that_run(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["train", "--quiet", *TINY, f"run_dir={a}"]) == 0
    before = sorted(p.name for p in (a / "checkpoints").iterdir())
    capsys.readouterr()
    assert main(["train", "--quiet", "--overwrite", *TINY, f"run_dir={b}",
                 f"checkpointing.checkpoint_dir={a / 'checkpoints'}"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"checkpointing.checkpoint_dir = {str(a / 'checkpoints')!r}: holds checkpoints of the run in " \
           f"{str(a)!r}" in line, line
    assert sorted(p.name for p in (a / "checkpoints").iterdir()) == before


def test_a_run_that_saves_no_checkpoints_starts_beside_another_runs_checkpoints(tmp_path, capsys):
    # NeMo RL's grpo_smoke.yaml turns checkpointing off and keeps grpo_math_1B.yaml's checkpoint_dir: run after it,
    # the other run's checkpoints are none of its business; they stay as they were.
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["train", "--quiet", *TINY, f"run_dir={a}"]) == 0
    before = sorted(p.name for p in (a / "checkpoints").iterdir())
    shared = f"checkpointing.checkpoint_dir={a / 'checkpoints'}"
    assert main(["train", "--quiet", *TINY, f"run_dir={b}", shared, "checkpointing.enabled=false"]) == 0
    assert main(["train", "--quiet", "--overwrite", *TINY, f"run_dir={b}", shared, "checkpointing.enabled=false"]) == 0
    assert sorted(p.name for p in (a / "checkpoints").iterdir()) == before
    capsys.readouterr()
    assert main(["train", "--quiet", *TINY, f"run_dir={tmp_path / 'c'}", shared]) == 2  # one that saves: refused
    assert "holds checkpoints of the run in" in capsys.readouterr().err


def test_overwrite_deletes_what_the_manifest_names_and_says_so(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--quiet", *TINY, f"run_dir={run}"]) == 0
    (run / "notes.txt").write_text("the user's notes\n")
    manifest = json.loads((run / MANIFEST_FILE).read_text())
    assert "config.yaml" in manifest["paths"] and manifest["checkpoint_dir"] == "checkpoints"
    capsys.readouterr()
    assert main(["train", "--quiet", "--overwrite", *TINY, f"run_dir={run}"]) == 0
    deleted = [ln for ln in capsys.readouterr().err.splitlines() if "--overwrite: deleting" in ln]
    assert {ln.rsplit(" ", 1)[1] for ln in deleted} == {
        str(run / "config.yaml"), str(run / "summary.json"), str(run / "checkpoints" / "step_1"),
        str(run / "logs" / "metrics.jsonl")}
    assert (run / "notes.txt").read_text() == "the user's notes\n"


def test_a_moved_run_directory_still_owns_its_files(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--quiet", *TINY, f"run_dir={run}"]) == 0
    run.rename(tmp_path / "moved")
    assert main(["train", "--quiet", "--overwrite", *TINY, f"run_dir={tmp_path / 'moved'}"]) == 0


def test_resume_with_nothing_to_resume_says_it_starts_fresh(tmp_path, capsys):
    assert main(["train", *TINY, f"run_dir={tmp_path / 'r'}", "checkpointing.resume=true",
                 "logger.progress_bar=false"]) == 0
    err = capsys.readouterr().err
    assert f"checkpointing.resume=true: no checkpoint in {tmp_path / 'r' / 'checkpoints'} to resume; starting a " \
           "fresh run" in err
