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


@pytest.mark.parametrize("spec", ["elsewhere:1", None])
def test_other_points_and_no_setting_do_nothing(monkeypatch, spec):
    # Nothing is killed: in this process (no interpreter of its own to start).
    if spec is None:
        monkeypatch.delenv(KILL_VAR, raising=False)
    else:
        monkeypatch.setenv(KILL_VAR, spec)
    reached = []
    for i in range(5):
        kill_point("other")
        kill_point("here")
        reached.append(i)
    assert reached == [0, 1, 2, 3, 4]


def test_a_malformed_setting_says_what_is_expected(monkeypatch):
    monkeypatch.setenv(KILL_VAR, "here")
    with pytest.raises(ValueError, match="expected <point>:<n>"):
        kill_point("here")
