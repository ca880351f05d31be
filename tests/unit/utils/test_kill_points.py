"""The RLPLANE_TEST_KILL_AT hook the exactly-once kill test uses (issue 20)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rlplane.utils.kill_points import KILL_VAR, kill_point

REACH_FIVE_TIMES = "from rlplane.utils.kill_points import kill_point\nfor i in range(5):\n" \
    "    kill_point('other')\n    kill_point('here')\n    print(i, flush=True)\n"


def run(spec: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != KILL_VAR}
    if spec is not None:
        env[KILL_VAR] = spec
    return subprocess.run([sys.executable, "-c", REACH_FIVE_TIMES], env=env, capture_output=True, text=True)


def test_kills_the_process_the_nth_time_its_point_is_reached():
    proc = run("here:3")
    assert proc.returncode == -9
    assert proc.stdout.split() == ["0", "1"]  # reached twice, killed the third time before printing


def test_other_points_and_no_setting_do_nothing():
    assert run("elsewhere:1").stdout.split() == ["0", "1", "2", "3", "4"]
    assert run(None).stdout.split() == ["0", "1", "2", "3", "4"]


def test_a_malformed_setting_says_what_is_expected(monkeypatch):
    monkeypatch.setenv(KILL_VAR, "here")
    with pytest.raises(ValueError, match="expected <point>:<n>"):
        kill_point("here")
