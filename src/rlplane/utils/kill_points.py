"""Test hook: ``RLPLANE_TEST_KILL_AT=<point>:<n>`` SIGKILLs this process the n-th time it reaches ``point``.

For the exactly-once kill test (``tests/functional/test_kill_resume.py``). Points in step order:
refit (before weights reach the generator; async: collector paused), generation (scored, not yet stored),
refill (before a dynamic-sampling refill), collector_generation (async: first group of a batch buffered),
evict (async: stale groups out, keys not released), train, logged, checkpoint_write (weights in
tmp_step_N), checkpoint_rename (before tmp_step_N -> step_N), checkpoint_prune (before a delete).
"""

from __future__ import annotations

import os
import signal

KILL_VAR = "RLPLANE_TEST_KILL_AT"
_reached: dict[str, int] = {}


def kill_point(name: str) -> None:
    """SIGKILL this process if ``RLPLANE_TEST_KILL_AT`` names ``name`` and this is its n-th time here."""
    spec = os.environ.get(KILL_VAR)
    if not spec:
        return
    point, _, n = spec.rpartition(":")
    if not point or not n.isdigit() or int(n) < 1:
        raise ValueError(f"{KILL_VAR}={spec!r}: expected <point>:<n> with n >= 1, e.g. train:3")
    if point != name:
        return
    _reached[name] = _reached.get(name, 0) + 1
    if _reached[name] == int(n):
        os.kill(os.getpid(), signal.SIGKILL)
