"""Deadlines on the calls a rollout waits for (``env.step_timeout_s``, ``policy.generation.timeout_s``), so a
hang ends the run with one line.

In-process the call runs on a reused helper thread (:mod:`rlplane.runtime.helper_threads`) that is left behind
on a timeout (a thread cannot be killed), so :class:`DeadlineExceeded` stops the run, never retried; Ray calls
use ``ray.get(timeout=...)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from rlplane.runtime import helper_threads

T = TypeVar("T")


class DeadlineExceeded(RuntimeError):
    """A call did not return within its deadline (one-line message naming what, the deadline and the key)."""


def deadline_message(what: str, timeout_s: float, key: str) -> str:
    return (f"{what} did not return within {timeout_s:g} s ({key} = {timeout_s:g}); raise {key} if it needs "
            "longer, or find why it hangs; the run stops (a hung call cannot be interrupted)")


def call_with_deadline(fn: Callable[[], T], timeout_s: float | None, what: str, key: str) -> T:
    """``fn()``, or :class:`DeadlineExceeded` after ``timeout_s`` seconds (None: called directly)."""
    if timeout_s is None:
        return fn()
    call = helper_threads.start(fn, f"deadline:{what}")
    call.join(timeout_s)
    if call.is_alive():
        raise DeadlineExceeded(deadline_message(what, timeout_s, key))
    return call.result()


def ray_get(ref, timeout_s: float | None = None, what: str = "", key: str = ""):
    """``ray.get(ref)`` within ``timeout_s``; a :class:`DeadlineExceeded` from the actor comes out as itself."""
    import ray

    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise DeadlineExceeded(deadline_message(what, timeout_s, key)) from None
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, DeadlineExceeded):
            raise DeadlineExceeded(str(e.cause)) from None
        raise
