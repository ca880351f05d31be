"""SIGINT, SIGTERM and SIGHUP to the driver stop the run at the next step boundary, with a checkpoint.

Inside :func:`stop_at_step_boundary` (``rlplane train``) the first signal records a request; the
session ends the step, checkpoints it and raises :class:`~rlplane.errors.TrainingInterrupted`. A
second SIGINT or SIGTERM, or :func:`interrupt_now` (the watchdog), stops at once (``KeyboardInterrupt``).
SIGHUP (the terminal closed) never stops at once: a closing terminal sends it more than once. It is left
ignored where it was (``nohup``).
"""

from __future__ import annotations

import errno
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from rlplane.errors import TrainingInterrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _State:
    installed: tuple[signal.Signals, ...] = ()
    requested: signal.Signals | None = None
    force = False
    hung_up = False  # a SIGHUP came: the terminal is gone


_state = _State()


def _handler(signum, frame) -> None:
    sig = signal.Signals(signum)
    if sig == signal.SIGHUP:
        _state.hung_up = True
        _mute_hung_up_outputs()
        if _state.force or _state.requested is not None:
            return
    elif _state.force or _state.requested is not None:
        raise KeyboardInterrupt
    _state.requested = sig
    again = "send SIGINT or SIGTERM to stop now" if sig == signal.SIGHUP else "send it again to stop now"
    # On stdout with the progress output: stderr keeps the run's one closing line.
    with suppress(OSError):
        print(f"rlplane: {sig.name} received: stopping after this step ({again})", flush=True)


def _mute_hung_up_outputs() -> None:
    """stdout / stderr on a terminal that hung up (writes fail with EIO) point at /dev/null from now on, so the
    step in progress, its checkpoint and the closing line do not fail on them."""
    for fd in (1, 2):
        try:
            os.write(fd, b"")
        except OSError as e:
            if e.errno == errno.EIO:
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, fd)
                os.close(null)


@contextmanager
def stop_at_step_boundary() -> Iterator[None]:
    """Within the block (in the main thread), SIGINT / SIGTERM / SIGHUP request a stop at the next step boundary."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.getsignal(s) for s in SIGNALS}
    ours = tuple(s for s in SIGNALS if not (s == signal.SIGHUP and old[s] == signal.SIG_IGN))  # nohup: keep it
    _state.installed, _state.requested, _state.force, _state.hung_up = ours, None, False, False
    reinstall()
    try:
        yield
    finally:
        _state.installed, _state.requested = (), None
        for s, h in old.items():  # after a hang-up, a later SIGHUP would only kill the teardown
            signal.signal(s, signal.SIG_IGN if s == signal.SIGHUP and _state.hung_up else h)


def reinstall() -> None:
    """Our handlers again, where :func:`stop_at_step_boundary` is active (after ``ray.init`` replaced SIGTERM's)."""
    if threading.current_thread() is threading.main_thread():
        for s in _state.installed:
            signal.signal(s, _handler)


@contextmanager
def children_ignore_sighup() -> Iterator[None]:
    """Processes started within inherit an ignored SIGHUP (a local Ray's): a closed terminal's SIGHUP to the whole
    process group is then the driver's alone, which stops at the step boundary and ends them."""
    if signal.SIGHUP not in _state.installed or threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, _handler)


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


__all__ = ["children_ignore_sighup", "interrupt_now", "reinstall", "requested", "stop_at_step_boundary", "stop_message"]
