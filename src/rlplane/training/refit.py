"""The session's refit: after the policy trains, the generator's weights are stale until pushed.

A generator that samples from the policy's own module (``hf``, colocated) is never stale. A
separate actor, or a backend that holds its own copy (``vllm``), gets the rank-0 policy's weights
before its next generation; under Ray they go from the policy actor to the rollout actor directly.
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
        """Push the policy's weights into the generator if it does not have them yet."""
        kill_point("refit")
        if self.stale:
            w = self.workers
            if w.cfg.policy.dtensor_cfg.enabled and len(w.policy) > 1:
                # Under FSDP get_weights is a gather every rank takes part in (rank 0 gets the weights).
                refs = [w.policy.lazy("get_weights", rank=r) for r in range(len(w.policy))]
                w.rollout.call("update_weights", refs[0])
                w.policy.wait(refs[1:])
            else:
                w.rollout.call("update_weights", w.policy.lazy("get_weights"))
            self.stale = False
