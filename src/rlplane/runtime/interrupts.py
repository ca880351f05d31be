"""SIGINT, SIGTERM and SIGHUP to the driver stop the run at the next step boundary, with a checkpoint.

A :class:`StopSignals` is a run's: inside :meth:`StopSignals.installed` (``rlplane train``, in the main thread)
its handlers take the process's signals; the first records a request, which the session's ``should_stop`` job
reads after the step (a checkpoint, then :class:`~rlplane.errors.TrainingInterrupted`). A second SIGINT or SIGTERM,
or :meth:`StopSignals.interrupt_now` (the watchdog), stops at once (``KeyboardInterrupt``). SIGHUP (the terminal
closed) never stops at once: a closing terminal sends it more than once. It is left ignored where it was
(``nohup``). One not installed (a library run) requests nothing; its ``interrupt_now`` still wakes the main thread.
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


class StopSignals:
    """The run's stop requests by signal; the handler is this object's, installed for a block only."""

    def __init__(self) -> None:
        self.installed_for: tuple[signal.Signals, ...] = ()  # the signals handled by this object now
        self.requested: signal.Signals | None = None  # the signal that asked to stop at the next step boundary
        self.force = False  # the next SIGINT / SIGTERM stops at once
        self.hung_up = False  # a SIGHUP came: the terminal is gone

    def handle(self, signum, frame) -> None:
        sig = signal.Signals(signum)
        if sig == signal.SIGHUP:
            self.hung_up = True
            _mute_hung_up_outputs()
            if self.force or self.requested is not None:
                return
        elif self.force or self.requested is not None:
            raise KeyboardInterrupt
        self.requested = sig
        again = "send SIGINT or SIGTERM to stop now" if sig == signal.SIGHUP else "send it again to stop now"
        # On stdout with the progress output: stderr keeps the run's one closing line.
        with suppress(OSError):
            print(f"rlplane: {sig.name} received: stopping after this step ({again})", flush=True)

    @contextmanager
    def installed(self) -> Iterator[StopSignals]:
        """Within the block (in the main thread), SIGINT / SIGTERM / SIGHUP request a stop at the next step boundary."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        old = {s: signal.getsignal(s) for s in SIGNALS}
        # nohup: an ignored SIGHUP stays ignored.
        self.installed_for = tuple(s for s in SIGNALS if not (s == signal.SIGHUP and old[s] == signal.SIG_IGN))
        self.requested, self.force, self.hung_up = None, False, False
        self.reinstall()
        try:
            yield self
        finally:
            self.installed_for, self.requested = (), None
            for s, h in old.items():  # after a hang-up, a later SIGHUP would only kill the teardown
                signal.signal(s, signal.SIG_IGN if s == signal.SIGHUP and self.hung_up else h)

    def reinstall(self) -> None:
        """This object's handlers again where it is installed (after ``ray.init`` replaced SIGTERM's)."""
        if threading.current_thread() is threading.main_thread():
            for s in self.installed_for:
                signal.signal(s, self.handle)

    @contextmanager
    def children_ignore_sighup(self) -> Iterator[None]:
        """Processes started within inherit an ignored SIGHUP (a local Ray's): a closed terminal's SIGHUP to the whole
        process group is then the driver's alone, which stops at the step boundary and ends them."""
        if signal.SIGHUP not in self.installed_for or threading.current_thread() is not threading.main_thread():
            yield
            return
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        try:
            yield
        finally:
            signal.signal(signal.SIGHUP, self.handle)

    def interrupt_now(self) -> None:
        """Raise ``KeyboardInterrupt`` in the main thread now (a real signal, so a blocking wait there wakes)."""
        self.force = True
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


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


def stop_message(sig: signal.Signals, step: int, checkpoint) -> TrainingInterrupted:
    """The one line a run stopped by ``sig`` after step ``step`` ends with (``checkpoint``: its directory, or None)."""
    where = (f"checkpoint {checkpoint}; resume with checkpointing.resume=true" if checkpoint is not None
             else "checkpointing is off: nothing to resume from")
    return TrainingInterrupted(f"stopped by {sig.name} after step {step} ({where})", int(sig))


__all__ = ["StopSignals", "stop_message"]
