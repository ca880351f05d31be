"""The session's refit: push the rank-0 policy's weights into stale generators before they generate.

A generator on the policy's own module is never stale. Under Ray the weights go once into the object
store and every generator resolves the same reference. Colocated generators sleep after generation
(:meth:`Refit.release`) and the next refit wakes them.
"""

from __future__ import annotations

from rlplane.training.workers import Workers
from rlplane.utils.kill_points import kill_point


class Refit:
    def __init__(self, workers: Workers):
        self.workers = workers
        self.stale = False

    def mark_stale(self) -> None:
        """The policy's weights changed (an optimizer step, a checkpoint load, a fresh actor)."""
        self.stale = not self.workers.generator_shares_weights

    def if_stale(self) -> None:
        """Push the policy's weights into the generators if they do not have them yet."""
        kill_point("refit")
        if self.stale:
            w = self.workers
            if w.cfg.policy.dtensor_cfg.enabled and len(w.policy) > 1:
                # Under FSDP get_weights is a gather all ranks join.
                refs = [w.policy.lazy("get_weights", rank=r) for r in range(len(w.policy))]
                w.rollout.update_weights(refs[0])
                w.policy.wait(refs[1:])
            else:
                w.rollout.update_weights(w.policy.lazy("get_weights"))
            self.stale = False

    def release(self) -> None:
        """Until the next refit: colocated generators sleep (weights freed) while the policy trains."""
        if self.workers.rollout.sleeps:
            self.workers.rollout.call("sleep")
            self.stale = True
