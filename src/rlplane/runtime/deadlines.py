"""Deadlines on the calls a rollout waits for, so that a hung environment or generator ends the run
with a one-line error instead of a silent hang.

In-process (``runtime: local``, and inside a Ray rollout actor) the call runs in a helper thread
and the caller waits at most ``timeout_s`` for it. A Python thread cannot be killed: on a timeout
the helper thread is left behind (a daemon, so it does not keep the interpreter alive) and
:class:`DeadlineExceeded` is raised; it is never retried or scored 0 like an ordinary failure, the
run stops (the left-behind call may still hold the model or the environment). For a call into a Ray
actor, :func:`ray_get` waits with ``ray.get(..., timeout=...)``.

Keys: ``env.step_timeout_s`` (one environment ``step`` call), ``policy.generation.timeout_s`` (one
``generate`` call of a turn).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class DeadlineExceeded(RuntimeError):
    """A call did not return within its deadline (one-line message naming what, the deadline and the key)."""


def deadline_message(what: str, timeout_s: float, key: str) -> str:
    return (f"{what} did not return within {timeout_s:g} s ({key} = {timeout_s:g}); raise {key} if it needs "
            "longer, or find why it hangs; the run stops (a hung call cannot be interrupted)")


def call_with_deadline(fn: Callable[[], T], timeout_s: float | None, what: str, key: str) -> T:
    """``fn()``, or :class:`DeadlineExceeded` if it has not returned after ``timeout_s`` seconds
    (None: no deadline, called directly). Exceptions of ``fn`` are re-raised as they are."""
    if timeout_s is None:
        return fn()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = e

    thread = threading.Thread(target=run, name=f"deadline:{what}"[:60], daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise DeadlineExceeded(deadline_message(what, timeout_s, key))
    if "error" in box:
        raise box["error"]
    return box["value"]


def ray_get(ref, timeout_s: float | None = None, what: str = "", key: str = ""):
    """``ray.get(ref)`` within ``timeout_s`` (None: no deadline). A :class:`DeadlineExceeded` raised
    inside the actor comes out as itself (its one line), not wrapped in Ray's traceback."""
    import ray

    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise DeadlineExceeded(deadline_message(what, timeout_s, key)) from None
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, DeadlineExceeded):
            raise DeadlineExceeded(str(e.cause)) from None
        raise
