"""A session that fails while starting (here: its dataset is missing) gives its run directory back:
another process may run there at once, as after close()."""

from __future__ import annotations

import fcntl
import os

import pytest

from rlplane.config.loading import load_config
from rlplane.data.errors import DatasetError
from rlplane.training import Session


def test_a_session_that_fails_to_start_leaves_its_run_dir_unlocked(tmp_path):
    run = tmp_path / "run"
    cfg = load_config(None, [f"run_dir={run}", "warmup.enabled=false", "data.dataset=jsonl",
                             f"data.train.path={tmp_path / 'missing.jsonl'}"])
    with pytest.raises(DatasetError, match="no such file"):
        Session(cfg, quiet=True)
    # A lock of its own on the file (another open file description, as another process has) is granted.
    fd = os.open(run / ".rlplane.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
