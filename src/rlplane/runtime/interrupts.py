"""SIGINT and SIGTERM to the driver stop the run at the next step boundary, with a checkpoint.

Inside :func:`stop_at_step_boundary` (``rlplane train``) the first signal records a request; the
session ends the step, checkpoints it and raises :class:`~rlplane.errors.TrainingInterrupted`. A
second signal, or :func:`interrupt_now` (the watchdog), stops at once (``KeyboardInterrupt``).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from rlplane.errors import TrainingInterrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _State:
    installed = False
    requested: signal.Signals | None = None
    force = False


_state = _State()


def _handler(signum, frame) -> None:
    if _state.force or _state.requested is not None:
        raise KeyboardInterrupt
    _state.requested = signal.Signals(signum)
    # On stdout with the progress output: stderr keeps the run's one closing line.
    print(f"rlplane: {_state.requested.name} received: stopping after this step (send it again to stop now)",
          flush=True)


@contextmanager
def stop_at_step_boundary() -> Iterator[None]:
    """Within the block (in the main thread), SIGINT / SIGTERM request a stop at the next step boundary."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.getsignal(s) for s in SIGNALS}
    _state.installed, _state.requested, _state.force = True, None, False
    reinstall()
    try:
        yield
    finally:
        _state.installed, _state.requested = False, None
        for s, h in old.items():
            signal.signal(s, h)


def reinstall() -> None:
    """Our handlers again, where :func:`stop_at_step_boundary` is active (after ``ray.init`` replaced SIGTERM's)."""
    if _state.installed and threading.current_thread() is threading.main_thread():
        for s in SIGNALS:
            signal.signal(s, _handler)


def requested() -> signal.Signals | None:
    """The signal that asked the run to stop at the next step boundary (None: none did)."""
    return _state.requested


def interrupt_now() -> None:
    """Raise ``KeyboardInterrupt`` in the main thread now (a real signal, so a blocking wait there wakes)."""
    _state.force = True
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def stop_message(sig: signal.Signals, step: int, checkpoint) -> TrainingInterrupted:
    """The one line a run stopped by ``sig`` after step ``step`` ends with (``checkpoint``: its directory, or None)."""
    where = (f"checkpoint {checkpoint}; resume with checkpointing.resume=true" if checkpoint is not None
             else "checkpointing is off: nothing to resume from")
    return TrainingInterrupted(f"stopped by {sig.name} after step {step} ({where})", int(sig))


__all__ = ["interrupt_now", "reinstall", "requested", "stop_at_step_boundary", "stop_message"]
