"""A test hook: ``RLPLANE_TEST_KILL_AT=<point>:<n>`` SIGKILLs this process the n-th time it reaches ``point``.

The exactly-once kill test (``tests/functional/test_kill_resume.py``) kills a run at chosen moments
and resumes it; random delays rarely land inside a short stretch such as a checkpoint's rename, so
the code names those stretches with :func:`kill_point`. The points, in the order a step reaches them:

    refit             Refit.if_stale, before the generator may get the policy's weights (a no-op
                      under runtime: local with hf, whose generator shares the policy's module)
                      async GRPO: CollectorHandle.refit, the collector paused, not yet updated
    generation        RolloutWorker.finish, responses generated and scored, not yet in the data plane
    refill            collect_rollouts, before a dynamic-sampling (or drop_group) refill batch is drawn
    collector_generation  async GRPO: a collector batch's first group in the replay buffer, the rest not
    evict             async GRPO: ReplayBuffer.sample, stale groups out of the buffer, their keys not
                      released (never reached with in_flight_weight_updates off: groups are exactly
                      max_trajectory_age_steps old there, see rlplane.async_rl.collector)
    train             after the policy (and critic) trained, before the step is logged
    logged            Session.end_step, the step's metrics and prompts logged, no checkpoint yet
    checkpoint_write  Checkpoints.save, the weights written into tmp_step_N, the loader's position not yet
    checkpoint_rename CheckpointManager.save, tmp_step_N whole and fsynced, before its rename to step_N
    checkpoint_prune  CheckpointManager._prune, before the first checkpoint past keep_top_k is deleted

Unset (always, outside that test) a point costs one environment lookup.
"""

from __future__ import annotations

import os
import signal

from rlplane.errors import ConfigError

KILL_VAR = "RLPLANE_TEST_KILL_AT"
_reached: dict[str, int] = {}


def check_kill_spec() -> tuple[str, int] | None:
    """``RLPLANE_TEST_KILL_AT`` as (point, n), None when unset; a malformed value is a one-line ``ConfigError``."""
    spec = os.environ.get(KILL_VAR)
    if not spec:
        return None
    point, _, n = spec.rpartition(":")
    if not point or not n.isdigit() or int(n) < 1:
        raise ConfigError([f"environment variable {KILL_VAR}={spec!r}: expected <point>:<n> with n >= 1, e.g. "
                           "train:3 (a test hook; unset it)"])
    return point, int(n)


def kill_point(name: str) -> None:
    """SIGKILL this process if ``RLPLANE_TEST_KILL_AT`` names ``name`` and this is its n-th time here."""
    if not os.environ.get(KILL_VAR):
        return
    point, n = check_kill_spec()
    if point != name:
        return
    _reached[name] = _reached.get(name, 0) + 1
    if _reached[name] == n:
        os.kill(os.getpid(), signal.SIGKILL)
