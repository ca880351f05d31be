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

from collections.abc import Callable

from rlplane.training.weight_check import WeightCheck
from rlplane.training.workers import Workers
from rlplane.utils.kill_points import kill_point


class Refit:
    """``version``: the weight version the policy holds (the session sets it: the step its weights serve);
    ``say``: where a weight-sync warning goes (``policy.generation.verify_weights: warn``)."""

    def __init__(self, workers: Workers, say: Callable[[str], None] = print):
        self.workers = workers
        self.stale = False
        self.unverified = True  # the generators' weights were not checked since the policy's last changed
        self.version = 0
        self.check = WeightCheck(workers.cfg.policy.generation, say)

    def mark_stale(self) -> None:
        """The policy's weights changed (an optimizer step, a checkpoint load, a fresh actor)."""
        self.stale = not self.workers.generator_shares_weights
        self.unverified = True

    def if_stale(self) -> None:
        """Push the policy's weights into the generators if they do not have them yet; then, once per
        change of the policy's weights, check that they hold them (:mod:`rlplane.training.weight_check`)."""
        kill_point("refit")
        if self.stale:
            w = self.workers
            if w.cfg.policy.dtensor_cfg.enabled and len(w.policy) > 1:
                # Under FSDP get_weights is a gather every rank takes part in (rank 0 gets the weights).
                refs = [w.policy.lazy("get_weights", rank=r) for r in range(len(w.policy))]
                w.rollout.update_weights(refs[0], version=self.version)
                w.policy.wait(refs[1:])
            else:
                w.rollout.update_weights(w.policy.lazy("get_weights"), version=self.version)
            self.stale = False
            self.unverified = True
        if self.unverified and self.check.enabled:
            w = self.workers
            self.check.run(w.rollout.weight_reports, w.policy, self.version, shared=w.generator_shares_weights,
                           sharded=w.cfg.policy.dtensor_cfg.enabled and len(w.policy) > 1)
        self.unverified = False

    def take_metrics(self) -> dict[str, float]:
        """The weight-sync checks' metrics since the last call (``weight_sync/*``, its seconds)."""
        return self.check.take_metrics()

    def release(self) -> None:
        """Generation is done until the next refit: colocated generators sleep (free their weights) while
        the policy trains on the same resources; the next :meth:`if_stale` wakes them with fresh weights."""
        if self.workers.rollout.sleeps:
            self.workers.rollout.call("sleep")
            self.stale = True
