"""freeze_heap and its switch (the Ray and process actors' freezes: tests/unit/runtime)."""

from __future__ import annotations

import gc

from rlplane.fast import switches
from rlplane.fast.heap import freeze_heap


def test_switched_off_freezes_nothing(monkeypatch):
    monkeypatch.setenv(switches.FREEZE_HEAP, "0")
    gc.unfreeze()
    assert freeze_heap() == 0 == gc.get_freeze_count()
