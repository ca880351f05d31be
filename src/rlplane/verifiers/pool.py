"""A pool of verifier processes with a deadline per item.

Processes, since only a process can be stopped from outside: an item past ``timeout_s`` has its worker
killed and replaced and scores ``None``. Workers are spawned on the first ``map`` and live until ``close()``.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import signal
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from typing import Any

_READY = "__ready__"
START_TIMEOUT_S = 120.0  # importing the verifier (sympy) on a loaded 2-core machine can take seconds


def resolve(spec: str) -> Callable:
    """``"package.module:function"`` -> the function."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _worker_main(conn, fn_spec: str) -> None:
    # Ctrl-C or a closed terminal reaches the whole process group: the driver stops at a step boundary
    # and closes the pool, so its workers finish the items in flight instead of dying with the signal.
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    fn = resolve(fn_spec)
    conn.send(_READY)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if msg is None:
            return
        i, args = msg
        try:
            out = (True, fn(*args))
        except Exception as e:  # a verifier error is a result (scored 0), not a dead worker
            out = (False, f"{type(e).__name__}: {e}")
        conn.send((i, out))


class _Worker:
    def __init__(self, ctx, fn_spec: str):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, fn_spec), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False
        self.dead = False
        self.task: tuple[int, float] | None = None  # (item index, start time)

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()


class VerifierPool:
    """Run ``fn(*args)`` for many ``args`` over ``num_workers`` processes, each cut off after ``timeout_s``.

    ``fn_spec``: ``"module:function"``. ``map`` returns per item ``fn``'s value, or ``None`` if it raised, timed
    out or its worker died (``last_errors`` says why). Thread-safe (calls are serialised).
    """

    def __init__(self, fn_spec: str, *, num_workers: int = 2, timeout_s: float = 5.0):
        if num_workers < 1:
            raise ValueError(f"num_workers = {num_workers}: a verifier pool needs at least 1 worker")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s = {timeout_s}: must be > 0")
        self.fn_spec, self.num_workers, self.timeout_s = fn_spec, num_workers, timeout_s
        self._ctx = mp.get_context("spawn")
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self.num_timeouts = 0
        self.last_errors: list[str] = []
        self._finalizer = weakref.finalize(self, VerifierPool._shutdown, self._workers)

    def map(self, items: Sequence[tuple]) -> list[Any]:
        with self._lock:
            return self._map(items)

    def _map(self, items: Sequence[tuple]) -> list[Any]:
        results: list[Any] = [None] * len(items)
        self.last_errors = []
        if not items:
            return results
        while len(self._workers) < self.num_workers:
            self._workers.append(_Worker(self._ctx, self.fn_spec))
        todo = deque(enumerate(items))
        started = time.monotonic()
        while todo or any(w.task for w in self._workers):
            now = time.monotonic()
            for w in self._workers:
                if w.ready and w.task is None and todo:
                    i, args = todo.popleft()
                    w.conn.send((i, tuple(args)))
                    w.task = (i, now)
            ready = wait([w.conn for w in self._workers], timeout=self._next_deadline(now, started))
            for w in list(self._workers):
                if w.conn in ready:
                    self._receive(w, results)
            now = time.monotonic()
            for k, w in enumerate(self._workers):
                overdue = w.task is not None and now - w.task[1] > self.timeout_s
                stuck = not w.ready and now - started > START_TIMEOUT_S
                dead = w.dead or (not w.proc.is_alive() and w.conn not in ready)
                if overdue or stuck or dead:
                    if w.task is not None:
                        if overdue:
                            self.num_timeouts += 1
                        why = f"timed out after {self.timeout_s:g} s" if overdue else "worker died"
                        self.last_errors.append(f"item {w.task[0]}: {why}")
                    elif stuck:
                        raise RuntimeError(f"verifier worker for {self.fn_spec} did "
                                           f"not start within {START_TIMEOUT_S:g} s")
                    w.kill()
                    self._workers[k] = _Worker(self._ctx, self.fn_spec)
        return results

    def _next_deadline(self, now: float, started: float) -> float:
        deadlines = [w.task[1] + self.timeout_s - now for w in self._workers if w.task is not None]
        if any(not w.ready for w in self._workers):
            deadlines.append(started + START_TIMEOUT_S - now)
        return max(0.0, min(deadlines)) + 0.01 if deadlines else 0.05

    def _receive(self, w: _Worker, results: list[Any]) -> None:
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            w.dead = True  # replaced by the liveness check in _map
            return
        if msg == _READY:
            w.ready = True
            return
        i, (ok, value) = msg
        if ok:
            results[i] = value
        else:
            self.last_errors.append(f"item {i}: {value}")
        w.task = None

    def close(self) -> None:
        self._finalizer()

    @staticmethod
    def _shutdown(workers: list[_Worker]) -> None:
        for w in workers:
            try:
                w.conn.send(None)
            except (OSError, ValueError):
                pass
        for w in workers:
            w.proc.join(timeout=2)
            w.kill()
        workers.clear()
