"""Keep long-lived objects out of the cyclic GC's full collections: :func:`freeze_heap` moves what is alive
now to the permanent generation, once a process has built its long-lived state. Plain twin: no freeze
(``RLPLANE_FREEZE_HEAP=0``)."""

from __future__ import annotations

import gc

from rlplane.fast.switches import FREEZE_HEAP, enabled


def freeze_heap() -> int:
    """Collect what is garbage now, then freeze the rest; returns the objects frozen in all (0 when off)."""
    if not enabled(FREEZE_HEAP):
        return gc.get_freeze_count()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def freeze_actor_heap(actor_self) -> int:
    """:func:`freeze_heap` in a Ray actor's process (``actor.__ray_call__.remote(freeze_actor_heap)``)."""
    return freeze_heap()
