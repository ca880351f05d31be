"""The watchdog, an object a run owns: a step with no progress for ``{loop}.watchdog_s`` seconds dumps every
worker's stack to ``logs/stacks.txt`` and stops the run naming the stuck worker.

Progress is a worker call returning (:meth:`Watchdog.tracking`, reported by the groups the run made with its
watchdog, runtime/groups.py) or a step boundary (:meth:`Watchdog.progress`). The stuck worker is the one whose call
still runs; a stuck Ray actor is killed (the driver's wait ends), a stuck local call gets a SIGINT in the main
thread. Ray actors dump their threads on ``SIGUSR1`` (:func:`install_stack_dump`; actors on the driver's node only).
"""

from __future__ import annotations

import faulthandler
import itertools
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rlplane.runtime.interrupts import StopSignals

STACK_SIGNAL = signal.SIGUSR1


@dataclass
class _Call:
    label: str
    method: str
    started: float
    refs: dict = field(default_factory=dict)  # Ray object ref -> (label, actor handle) of the worker computing it


def install_stack_dump(actor_self=None) -> dict:
    """In a Ray actor: dump every thread's stack to a file of its own on ``SIGUSR1``; returns where. (faulthandler
    holds the file open for as long as the signal is registered.)"""
    import ray

    f = tempfile.TemporaryFile("w+")  # already unlinked: nothing left behind; read through /proc/<pid>/fd
    faulthandler.register(STACK_SIGNAL, file=f, all_threads=True, chain=False)
    return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(),
            "path": f"/proc/{os.getpid()}/fd/{f.fileno()}"}


class Watchdog:
    """A run's watch on its worker calls: the calls in flight (:meth:`tracking`, reported by the worker groups the
    run made with it), the Ray actors whose stacks it can dump, the last progress. Past ``timeout_s`` (None: off)
    without progress, :meth:`fire`: stacks dumped to ``stacks_path``, the stuck worker named in ``verdict`` (``key``
    names the setting), a stuck Ray actor killed, a stuck local call woken by ``interrupt`` (the run's
    :meth:`StopSignals.interrupt_now <rlplane.runtime.interrupts.StopSignals.interrupt_now>`)."""

    def __init__(self, timeout_s: float | None, key: str, stacks_path: Path,
                 interrupt: Callable[[], None] | None = None):
        self.timeout_s, self.key, self.stacks_path = timeout_s, key, stacks_path
        self.interrupt = interrupt or StopSignals().interrupt_now
        self.verdict: str | None = None
        self._calls: dict[int, _Call] = {}
        self._actors: dict[str, object] = {}  # label -> the ref of its install_stack_dump() answer (Ray)
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._last_progress = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._old_sigint = None

    # ---- what the worker groups report
    def progress(self) -> None:
        self._last_progress = time.monotonic()

    @contextmanager
    def tracking(self, label: str, method: str, refs: dict | None = None) -> Iterator[None]:
        """A worker call in flight: ``label`` (e.g. ``generator 0``), the method and, under Ray, its object refs,
        each to ``(label, actor handle)`` of the worker computing it."""
        key = next(self._ids)
        with self._lock:
            self._calls[key] = _Call(label, method, time.monotonic(), refs or {})
        try:
            yield
        finally:
            with self._lock:
                self._calls.pop(key, None)
            self.progress()

    def register_actor(self, label: str, answer_ref) -> None:
        """Ray actor ``label`` whose stacks can be dumped (``answer_ref``: its :func:`install_stack_dump` call)."""
        self._actors[label] = answer_ref

    def forget_actor(self, label: str) -> None:
        self._actors.pop(label, None)

    def stuck_calls(self) -> list[tuple[str, object]]:
        """``(label (method, running N s), Ray actor handle or None)`` of each call still running: Ray calls
        whose result is not ready, else the innermost local call."""
        now = time.monotonic()
        with self._lock:
            calls = list(self._calls.values())
        out = []
        for c in calls:
            if c.refs:
                import ray

                _, pending = ray.wait(list(c.refs), num_returns=len(c.refs), timeout=0)
                out += [(f"{c.refs[r][0]} ({c.method}, running {now - c.started:.0f} s)", c.refs[r][1])
                        for r in pending]
        if not out and calls:
            c = calls[-1]
            out.append((f"{c.label} ({c.method}, running {now - c.started:.0f} s)", None))
        return out

    def _actor_stacks(self, f) -> None:
        """Each registered Ray actor's threads, after a SIGUSR1 (actors on this node only)."""
        import ray

        here = ray.get_runtime_context().get_node_id()
        where = {}
        for label, ref in list(self._actors.items()):
            try:
                where[label] = ray.get(ref, timeout=2)
            except Exception as e:  # noqa: BLE001 - a dead actor's stack is no stack
                f.write(f"\n== {label}: no stack ({type(e).__name__})\n")
                continue
            if where[label]["node"] == here:
                try:
                    os.kill(where[label]["pid"], STACK_SIGNAL)
                except OSError:
                    pass
        time.sleep(0.5)  # the handlers write at once; the files are read after
        for label, w in where.items():
            if w["node"] != here:
                f.write(f"\n== {label} (pid {w['pid']}, node {w['node'][:8]}): on another node, not dumped\n")
                continue
            try:
                text = Path(w["path"]).read_text()
            except OSError as e:
                text = f"(not readable: {e.strerror})"
            f.write(f"\n== {label} (pid {w['pid']})\n{text or '(nothing written)'}\n")

    def dump_stacks(self, path: Path) -> None:
        """Every thread of the driver and of each registered Ray actor, into ``path``."""
        with open(path, "w") as f:
            f.write("== driver (pid %d)\n" % os.getpid())
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
            if self._actors:
                self._actor_stacks(f)

    # ---- the watch
    def start(self) -> None:
        if self.timeout_s is None or self._thread is not None:
            return
        if threading.current_thread() is threading.main_thread() and not callable(signal.getsignal(signal.SIGINT)):
            # SIGINT ignored (a background job of a script, `nohup ... &`): the wake-up below would be lost.
            self._old_sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
        self.progress()
        self._thread = threading.Thread(target=self._watch, name="rlplane-watchdog", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        tick = min(1.0, self.timeout_s / 4)
        while not self._stop.wait(tick):
            if time.monotonic() - self._last_progress > self.timeout_s:
                self.fire()
                return

    def fire(self) -> None:
        stuck = self.stuck_calls()
        try:
            self.dump_stacks(self.stacks_path)
            where = f"every worker's stack is in {self.stacks_path}"
        except Exception as e:  # noqa: BLE001 - the verdict matters more than the dump
            where = f"the stacks could not be written ({type(e).__name__}: {e})"
        who = "; ".join(text for text, _ in stuck) if stuck else "the driver (no worker call in flight)"
        self.verdict = (f"watchdog: no progress for {self.timeout_s:g} s ({self.key} = {self.timeout_s:g}); "
                        f"stuck: {who}; {where}; the run stops (resume from its last checkpoint with "
                        "checkpointing.resume=true)")
        handles = [h for _, h in stuck if h is not None]
        if handles:  # the driver's wait for them ends with an actor error, replaced by the verdict
            import ray

            for h in handles:
                ray.kill(h)
        else:
            self.interrupt()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._old_sigint is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._old_sigint)
            self._old_sigint = None


@contextmanager
def untracked(label: str, method: str, refs: dict | None = None) -> Iterator[None]:
    """What a group made without a watchdog reports its calls to: nothing."""
    yield


def tracker(watchdog: Watchdog | None) -> Callable:
    """``watchdog.tracking``, or :func:`untracked` for a group no run watches (a test's, a tool's)."""
    return watchdog.tracking if watchdog is not None else untracked
