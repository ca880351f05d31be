"""The session's refit: after the policy trains, the generators' weights are stale until pushed.

A generator that samples from the policy's own module (one ``hf`` generator in this process) is
never stale. Otherwise every generator gets the rank-0 policy's weights before its next
generation. They are fetched once per refit: under Ray ``get_weights`` returns an object reference
(the weights are in the object store once) and the same reference goes to every generator, each
resolving it in its own process; the driver never holds them.

Colocated under Ray the generators share the policy ranks' bundles: :meth:`Refit.release` puts
them to sleep (their weights freed) once a step's generation is done, and the next refit wakes them.
Validation needs no release: the policy does not train between it and the next step's generation.
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
                # Under FSDP get_weights is a gather every rank takes part in (rank 0 gets the weights).
                refs = [w.policy.lazy("get_weights", rank=r) for r in range(len(w.policy))]
                w.rollout.update_weights(refs[0])
                w.policy.wait(refs[1:])
            else:
                w.rollout.update_weights(w.policy.lazy("get_weights"))
            self.stale = False

    def release(self) -> None:
        """Generation is done until the next refit: colocated generators sleep (free their weights) while
        the policy trains on the same resources; the next :meth:`if_stale` wakes them with fresh weights."""
        if self.workers.rollout.sleeps:
            self.workers.rollout.call("sleep")
            self.stale = True
