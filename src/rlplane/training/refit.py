"""The session's refit: push the rank-0 policy's weights into stale generators before they generate.

A generator on the policy's own module is never stale. Under Ray the weights go once into the object
store and every generator resolves the same reference. Colocated generators sleep after generation
(:meth:`Refit.release`) and the next refit wakes them.
"""

from __future__ import annotations

from collections.abc import Callable

from rlplane.training.weight_check import WeightCheck, WeightCheckOptions
from rlplane.training.workers import Workers
from rlplane.utils.kill_points import kill_point
from rlplane.workers.policy import PolicyWorker


class Refit:
    """``version``: the weight version the policy holds (the session sets it: the step its weights serve);
    ``check``: the plan's weight-sync check, ``say`` where its warnings go; ``sharded``: the policy's weights are
    gathered by every rank together (FSDP over several ranks)."""

    def __init__(self, workers: Workers, check: WeightCheckOptions, *, sharded: bool = False,
                 say: Callable[[str], None] = print):
        self.workers, self.sharded = workers, sharded
        self.stale = False
        self.unverified = True  # the generators' weights were not checked since the policy's last changed
        self.version = 0
        self.check = WeightCheck(check, say)

    def mark_stale(self) -> None:
        """The policy's weights changed (an optimizer step, a checkpoint load, a fresh actor)."""
        self.stale = not self.workers.generator_shares_weights
        self.unverified = True

    def if_stale(self) -> None:
        """Push the policy's weights into the generators if stale; once per change of them, check they arrived."""
        kill_point("refit")
        if self.stale:
            w = self.workers
            if self.sharded:
                # Under FSDP get_weights is a gather all ranks join.
                refs = [w.policy.lazy(PolicyWorker.get_weights, rank=r) for r in range(len(w.policy))]
                w.rollout.update_weights(refs[0], version=self.version)
                w.policy.wait(refs[1:])
            else:
                w.rollout.update_weights(w.policy.lazy(PolicyWorker.get_weights), version=self.version)
            self.stale = False
            self.unverified = True
        if self.unverified and self.check.enabled:
            w = self.workers
            self.check.run(w.rollout.weight_reports, w.policy, self.version, shared=w.generator_shares_weights,
                           sharded=self.sharded)
        self.unverified = False

    def trained(self, version: int) -> None:
        """The policy's weights are now ``version`` (the step that trained them + 1): they serve the next step, and
        a refit before it (a validation's) stamps them so."""
        self.version = version

    def take_metrics(self, upto: int) -> dict[str, float]:
        """The weight-sync checks' metrics of the versions up to ``upto`` (the step whose row they join)."""
        return self.check.take_metrics(upto)

    def release(self) -> None:
        """Until the next refit: colocated generators sleep (weights freed) while the policy trains."""
        if self.workers.rollout.sleeps:
            self.workers.rollout.sleep()
            self.stale = True
