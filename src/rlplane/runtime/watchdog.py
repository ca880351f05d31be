"""The watchdog: a step with no progress for ``{loop}.watchdog_s`` seconds dumps every worker's stack to
``logs/stacks.txt`` and stops the run naming the stuck worker.

Progress is a worker call returning (:func:`tracking`, from runtime/groups.py) or a step boundary
(:func:`progress`). The stuck worker is the one whose call still runs; a stuck Ray actor is killed
(the driver's wait ends), a stuck local call gets a SIGINT in the main thread. Ray actors dump
their threads on ``SIGUSR1`` (:func:`install_stack_dump`; actors on the driver's node only).
"""

from __future__ import annotations

import faulthandler
import itertools
import os
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rlplane.runtime import interrupts

STACK_SIGNAL = signal.SIGUSR1


@dataclass
class _Call:
    label: str
    method: str
    started: float
    refs: dict = field(default_factory=dict)  # Ray object ref -> (label, actor handle) of the worker computing it


_calls: dict[int, _Call] = {}
_actors: dict[str, object] = {}  # label -> the ref of its install_stack_dump() answer (Ray)
_ids = itertools.count()
_lock = threading.Lock()
_last_progress = [time.monotonic()]
_stack_file = []  # an actor's open dump file (faulthandler writes to its descriptor)


def progress() -> None:
    _last_progress[0] = time.monotonic()


@contextmanager
def tracking(label: str, method: str, refs: dict | None = None) -> Iterator[None]:
    """A worker call in flight for the watchdog: ``label`` (e.g. ``generator 0``), the method and, under
    Ray, its object refs, each to ``(label, actor handle)`` of the worker computing it."""
    key = next(_ids)
    with _lock:
        _calls[key] = _Call(label, method, time.monotonic(), refs or {})
    try:
        yield
    finally:
        with _lock:
            _calls.pop(key, None)
        progress()


def install_stack_dump(actor_self=None) -> dict:
    """In a Ray actor: dump every thread's stack to a file of its own on ``SIGUSR1``; returns where."""
    import ray

    f = tempfile.TemporaryFile("w+")  # already unlinked: nothing left behind; read through /proc/<pid>/fd
    _stack_file.append(f)
    faulthandler.register(STACK_SIGNAL, file=f, all_threads=True, chain=False)
    return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(),
            "path": f"/proc/{os.getpid()}/fd/{f.fileno()}"}


def register_actor(label: str, answer_ref) -> None:
    """Ray actor ``label`` whose stacks the watchdog can dump (``answer_ref``: its :func:`install_stack_dump` call)."""
    _actors[label] = answer_ref


def forget_actor(label: str) -> None:
    _actors.pop(label, None)


def stuck_calls() -> list[tuple[str, object]]:
    """``(label (method, running N s), Ray actor handle or None)`` of each call still running: Ray calls
    whose result is not ready, else the innermost local call."""
    now = time.monotonic()
    with _lock:
        calls = list(_calls.values())
    out = []
    for c in calls:
        if c.refs:
            import ray

            _, pending = ray.wait(list(c.refs), num_returns=len(c.refs), timeout=0)
            out += [(f"{c.refs[r][0]} ({c.method}, running {now - c.started:.0f} s)", c.refs[r][1]) for r in pending]
    if not out and calls:
        c = calls[-1]
        out.append((f"{c.label} ({c.method}, running {now - c.started:.0f} s)", None))
    return out


def _actor_stacks(f) -> None:
    """Each registered Ray actor's threads, after a SIGUSR1 (actors on this node only)."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    where = {}
    for label, ref in list(_actors.items()):
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


def dump_stacks(path: Path) -> None:
    """Every thread of the driver and of each registered Ray actor, into ``path``."""
    with open(path, "w") as f:
        f.write("== driver (pid %d)\n" % os.getpid())
        f.flush()
        faulthandler.dump_traceback(file=f, all_threads=True)
        if _actors:
            _actor_stacks(f)


class Watchdog:
    """Watches for ``timeout_s`` (None: off) without progress; ``key`` names the setting in the message."""

    def __init__(self, timeout_s: float | None, key: str, stacks_path: Path):
        self.timeout_s, self.key, self.stacks_path = timeout_s, key, stacks_path
        self.verdict: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._old_sigint = None

    def start(self) -> None:
        if self.timeout_s is None or self._thread is not None:
            return
        if threading.current_thread() is threading.main_thread() and not callable(signal.getsignal(signal.SIGINT)):
            # SIGINT ignored (a background job of a script, `nohup ... &`): the wake-up below would be lost.
            self._old_sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
        progress()
        self._thread = threading.Thread(target=self._watch, name="rlplane-watchdog", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        tick = min(1.0, self.timeout_s / 4)
        while not self._stop.wait(tick):
            if time.monotonic() - _last_progress[0] > self.timeout_s:
                self.fire()
                return

    def fire(self) -> None:
        stuck = stuck_calls()
        try:
            dump_stacks(self.stacks_path)
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
            interrupts.interrupt_now()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._old_sigint is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._old_sigint)
            self._old_sigint = None
