"""The ray data plane's background release: refs of what a client put, or of rows that went, are let go a grace
period later (after the borrowers), in order, and at once when the client closes."""

from __future__ import annotations

import time
import weakref

import pytest

from rlplane.dataplane import ray_objects
from rlplane.dataplane.ray_objects import Background


class Payload:  # stands in for a Stored (its refs): what matters is when the last reference to it goes
    pass


def _alive(refs):  # (a Payload is in no cycle: it goes with its last reference, no collection needed)
    return [r() is not None for r in refs]


def _gone(ref, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while ref() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    return ref() is None


def _wait_until(t0, t):
    time.sleep(max(0.0, t0 + t - time.monotonic()))


def test_drop_later_keeps_each_payload_for_the_grace_then_lets_it_go(monkeypatch):
    monkeypatch.setattr(ray_objects, "RELEASE_GRACE_S", 1.0)
    bg = Background()
    try:
        first, second = Payload(), Payload()
        refs = [weakref.ref(first), weakref.ref(second)]
        t0 = time.monotonic()
        bg.drop_later([first])
        _wait_until(t0, 0.5)
        bg.drop_later([second])  # due at ~1.5 s
        del first, second
        _wait_until(t0, 0.8)
        assert _alive(refs) == [True, True]  # both inside their grace
        assert _gone(refs[0]) and _alive(refs[1:]) == [True] or time.monotonic() > t0 + 1.5
        assert _gone(refs[1])  # let go with no other call to wake the thread
    finally:
        bg.close()


def test_close_lets_go_of_what_was_due_later(monkeypatch):
    monkeypatch.setattr(ray_objects, "RELEASE_GRACE_S", 60.0)
    bg = Background()
    payload = Payload()
    ref = weakref.ref(payload)
    bg.drop_later([payload])
    del payload
    bg.close()
    assert _gone(ref)


@pytest.mark.parametrize("payloads", [[], [[]]])
def test_nothing_to_drop_starts_nothing_or_drops_an_empty_list(payloads):
    bg = Background()
    bg.drop_later(payloads[0] if payloads else [])
    assert bg._thread is None  # an empty drop is not queued
    bg.close()
