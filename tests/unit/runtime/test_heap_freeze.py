"""Each process that holds a model freezes its long-lived objects out of full garbage collections
(rlplane.fast.heap): the driver's session, a process-hosted actor (test_process_actor.py) and the Ray
worker actors, checked here."""

from __future__ import annotations

import gc

from rlplane.fast.heap import freeze_heap
from rlplane.runtime.groups import RayActor, RayGroup


class Probe:
    def __init__(self):
        import torch  # noqa: F401 - a worker's imports: tens of thousands of objects

    def ping(self) -> int:
        return 0

    def gc_state(self) -> tuple[int, int]:
        """(objects frozen, objects the cyclic collector still tracks) in this actor's process."""
        return gc.get_freeze_count(), len(gc.get_objects())


def test_freeze_heap_moves_what_is_alive_out_of_the_collectors_reach():
    try:
        frozen = freeze_heap()
        # Another thread of the test process (a Ray client, a data plane's background thread) may free a few
        # frozen objects between the freeze and the count; it never adds to them.
        assert frozen > 10_000 and frozen * 0.99 < gc.get_freeze_count() <= frozen
        assert len(gc.get_objects()) < frozen / 10
    finally:
        gc.unfreeze()


def test_ray_worker_actors_freeze_their_heap(ray_session):
    group = RayGroup(Probe, [{}, {}], num_cpus=0.1)
    for frozen, tracked in group.run(Probe.gc_state):
        assert frozen > 10_000 and tracked < frozen / 10
    actor = RayActor(Probe, {}, num_cpus=0.1)
    frozen, tracked = actor.call(Probe.gc_state)
    assert frozen > 10_000 and tracked < frozen / 10
