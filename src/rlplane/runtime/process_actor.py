"""A local actor in a process of its own: ``make_actor("local", ..., process=True)``, off the driver's GIL.

The child (``spawn``) builds the object and serves calls over a pipe, one at a time, with the thread and
Ray versions' semantics; an error comes back with its type, message and the child's traceback as
``__cause__``. Large tensors cross as shared-memory handles; a ``MemoryDataPlane`` argument becomes a
``ForwardingDataPlane``; :meth:`ProcessActor.share` stages weights in shared memory across calls. The
child ends with the parent (a watchdog polls ``getppid``; ``PR_SET_PDEATHSIG`` fires per thread).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import multiprocessing as mp
import os
import pickle
import signal
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from rlplane.dataplane import MemoryDataPlane
from rlplane.dataplane.forwarding import serve_to_other_process
from rlplane.fast.heap import freeze_heap
from rlplane.runtime.calls import method_name
from rlplane.runtime.worker_env import WORKER_ENV
from rlplane.utils.shared_pickle import dumps

__all__ = ["ProcessActor", "RemoteTraceback"]

_CTX = mp.get_context("spawn")  # fork would copy the driver's threads' locks (torch's, the plane's) mid-use
PARENT_POLL_S = 0.5  # how often the child checks that its parent is alive
CLOSE_TIMEOUT_S = 30.0  # for the object's close() in the child before it is killed
_uids = itertools.count(1)


class RemoteTraceback(Exception):
    """The child's traceback text, as the ``__cause__`` of an error re-raised from a child's call."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


class _Staged:
    """A shared-memory buffer argument: its tensors cross once, then only ``(name, uid)``."""

    def __init__(self, name: str, uid: int, tensors: dict[str, torch.Tensor] | None):
        self.name, self.uid, self.tensors = name, uid, tensors


class ProcessActor:
    """One worker in a child process; ``setup``: ``(function, args)`` run there first; ``torch_threads``: its
    intra-op threads."""

    obj = None  # the worker lives in another process

    def __init__(self, cls: type, kwargs: dict[str, Any], *, setup: Sequence[tuple[Callable, tuple]] = (),
                 torch_threads: int | None = None):
        self._name = cls.__name__
        self._lock = threading.Lock()
        self._servers = []
        self._staged: dict[str, tuple[int, dict[str, torch.Tensor]]] = {}
        self._sent: set[tuple[str, int]] = set()
        self._closed = False
        sent_kwargs = {}
        child_ends = []
        for key, value in kwargs.items():
            if isinstance(value, MemoryDataPlane):
                value, server = serve_to_other_process(value, _CTX)
                self._servers.append(server)
                child_ends.append(value._conn)
            sent_kwargs[key] = value
        self._conn, child_conn = _CTX.Pipe(duplex=True)
        threads = torch_threads if torch_threads is not None else torch.get_num_threads()
        self.process = _CTX.Process(target=_child_main, args=(child_conn, os.getpid(), list(setup), threads),
                                    name=f"rlplane-{self._name}")  # not daemonic: it may start its own (verifier pools)
        # OMP_WAIT_POLICY=PASSIVE etc. in the child where unset, as for Ray workers.
        with _environment(WORKER_ENV):
            self.process.start()
        child_conn.close()  # the child holds its own copy: EOF here once it is gone
        try:
            self._request(("init", cls, sent_kwargs))
        except BaseException:
            self.close()
            raise
        finally:
            for end in child_ends:  # the child holds them now
                end.close()
        atexit.register(self.close)  # an interpreter that exits without close() still ends the child cleanly

    # ---- calls
    def call(self, method: Callable, *args, **kwargs):
        return self._request(("call", method_name(method), args, kwargs))

    lazy = call  # as locally: the value itself

    def share(self, name: str, tensors: Mapping[str, torch.Tensor]) -> _Staged:
        """``tensors`` copied into shared buffer ``name`` (reallocated when their layout changes), as a :meth:`call`
        argument; do not share again while the child may read it."""
        held = self._staged.get(name)
        layout = {k: (tuple(v.shape), v.dtype) for k, v in tensors.items()}
        if held is None or {k: (tuple(v.shape), v.dtype) for k, v in held[1].items()} != layout:
            held = (next(_uids), {k: torch.empty(shape, dtype=dtype).share_memory_()
                                  for k, (shape, dtype) in layout.items()})
            self._staged[name] = held
        uid, buffer = held
        with torch.no_grad():
            for k, v in tensors.items():
                buffer[k].copy_(v)
        return _Staged(name, uid, None if (name, uid) in self._sent else buffer)

    def _request(self, message: tuple) -> Any:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self._name} process actor is closed")
            try:
                self._conn.send_bytes(dumps(message))
                ok, value, text = self._conn.recv()
            except (EOFError, OSError, BrokenPipeError):
                self.process.join(timeout=5)
                raise RuntimeError(f"the {self._name} process died (exit code {self.process.exitcode}) "
                                   f"during {message[0]} {message[1] if message[0] == 'call' else ''}") from None
            if message[0] == "call":  # staged buffers went across: next time their name is enough
                self._sent.update((a.name, a.uid) for a in (*message[2], *message[3].values())
                                  if isinstance(a, _Staged) and a.tensors is not None)
        if not ok:
            raise value from RemoteTraceback(text)
        return value

    # ---- shutdown
    def close(self) -> None:
        """Close the object in the child (its ``close`` if any), end the process, stop serving its plane."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._conn.send(("close",))
                if self._conn.poll(CLOSE_TIMEOUT_S):
                    self._conn.recv()
            except (EOFError, OSError):
                pass
            self._conn.close()
        _terminate(self.process)
        for server in self._servers:
            server.close()
        atexit.unregister(self.close)

    kill = close


@contextlib.contextmanager
def _environment(defaults: dict[str, str]):
    """``defaults`` set in os.environ where unset (the spawned child inherits them), then removed again."""
    added = [k for k in defaults if k not in os.environ]
    os.environ.update({k: defaults[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def _terminate(process: Any) -> None:
    process.join(timeout=CLOSE_TIMEOUT_S)
    if process.is_alive():
        process.kill()
        process.join(timeout=5)


# ---- the child
def _watch_parent(parent_pid: int) -> None:
    """Exit at once when the parent is gone (reparented: getppid changes), whatever the child is doing."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def _reply(conn: Any, ok: bool, value: Any, text: str = "") -> None:
    """Send (ok, value, traceback text); a value or error that cannot be pickled goes as a RuntimeError."""
    try:
        data = dumps((ok, value, text))
        if not ok:
            pickle.loads(data)  # an exception whose class cannot be rebuilt there fails here instead
    except Exception as e:  # noqa: BLE001
        what = f"{type(value).__name__}: {value}" if not ok else f"its result ({type(value).__name__})"
        data = dumps((False, RuntimeError(f"{what} (could not be sent back: {e})"), text))
    conn.send_bytes(data)


def _resolve(value: Any, staged: dict[str, tuple[int, dict]]) -> Any:
    if not isinstance(value, _Staged):
        return value
    if value.tensors is not None:
        staged[value.name] = (value.uid, value.tensors)
    uid, tensors = staged[value.name]
    assert uid == value.uid, f"shared buffer {value.name!r}: version {value.uid} was never received"
    return tensors


def _child_main(conn: Any, parent_pid: int, setup: list, threads: int) -> None:
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="parent-watch", daemon=True).start()
    # Ctrl-C and a closed terminal reach the whole process group: the parent handles them and closes this process.
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    torch.set_num_threads(threads)
    obj = None
    staged: dict[str, tuple[int, dict]] = {}
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the parent closed its end or died
            break
        kind = message[0]
        try:
            if kind == "init":
                for fn, args in setup:
                    fn(*args)
                obj = message[1](**message[2])
                freeze_heap()  # what it built (a model, imports) out of full collections' reach
                result = None
            elif kind == "close":
                close = getattr(obj, "close", None)
                if close is not None:
                    close()
                _reply(conn, True, None)
                break
            else:
                _, method, args, kwargs = message
                result = getattr(obj, method)(*(_resolve(a, staged) for a in args),
                                              **{k: _resolve(v, staged) for k, v in kwargs.items()})
        except Exception as e:  # noqa: BLE001 - re-raised in the parent with this traceback
            _reply(conn, False, e, traceback.format_exc())
            continue
        _reply(conn, True, result)
    conn.close()
