"""A `memory` plane used from another process: index calls forwarded, columns in shared memory.

The memory plane lives in one process (the driver's, under ``runtime: local``). A worker hosted in
a child process (the async collector, :mod:`rlplane.runtime.process_actor`) gets a
:class:`ForwardingDataPlane`: encoding, validation and padding run in the child as for any
`IndexedClient`; each index call is sent over a pipe to a :class:`PlaneServer` thread in the
plane's process, which runs it on the plane (under the plane's lock, one call at a time, like the
Ray store actor). A put's packed columns are moved into shared memory in the child (one copy) and
only their handles cross the pipe (torch's multiprocessing reductions), so the parent stores them
without a copy and its workers read them in place; a read in the child maps the parent's columns
the same way. The server stores and answers lookups: it never decodes a column.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import torch
import torch.multiprocessing  # noqa: F401 - registers the reductions that send tensors as shared-memory handles

from .client import DEFAULT_TOKEN_FIELDS, IndexedClient
from .codec import Column
from .columns import INPUT_IDS
from .errors import DataPlaneError
from .index import LookupPlan

__all__ = ["ForwardingDataPlane", "PlaneServer", "share_column"]

# The `PlaneIndex` methods a remote client may call (as the Ray store actor allows).
INDEX_METHODS = frozenset(
    {"register", "seq_lens", "commit", "lookup", "list", "describe", "status", "ready", "expected", "clear",
     "num_chunks"}
)


def _in_shared_memory(t: torch.Tensor) -> torch.Tensor:
    """``t`` backed by shared memory: moved there in place when it owns its storage, else copied first
    (a view must not drag the rest of a larger storage, nor move its owner's, into the plane)."""
    if t.untyped_storage().nbytes() != t.numel() * t.element_size() or t.storage_offset() != 0:
        t = t.clone()
    return t.share_memory_()


def share_column(col: Column) -> Column:
    """The column with its tensors in shared memory, so that sending it passes handles only."""
    return Column(_in_shared_memory(col.values), None if col.offsets is None else _in_shared_memory(col.offsets))


def _shareable(plan: LookupPlan) -> LookupPlan:
    """The plan with every column in shared memory: the client's columns already are; one this
    process wrote is copied (sending it would otherwise move its storage in place, under a reader
    of this process that may hold it right now)."""
    def shared(col: Column) -> Column:
        if col.values.is_shared() and (col.offsets is None or col.offsets.is_shared()):
            return col
        return Column(col.values.clone().share_memory_(),
                      None if col.offsets is None else col.offsets.clone().share_memory_())

    parts = {f: [(shared(col), rows, pos) for col, rows, pos in field_parts] for f, field_parts in plan.parts.items()}
    return LookupPlan(parts, plan.seq_lens, plan.tags, plan.task_name)


class PlaneServer:
    """Serves one forwarding client's index calls against ``plane`` (a `MemoryDataPlane`) in a daemon
    thread of the plane's process, until the connection closes."""

    def __init__(self, plane: Any, conn: Any):
        self.plane, self.conn = plane, conn
        self.thread = threading.Thread(target=self._serve, name="data-plane-server", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                method, args = self.conn.recv()
            except (EOFError, OSError):  # the client's process ended, or close()
                return
            try:
                if method not in INDEX_METHODS:
                    raise DataPlaneError(f"forwarded data-plane call {method!r} is not an index method")
                result = self.plane._index_call(method, *args)
                if method == "lookup":
                    result = _shareable(result)
                reply = (True, result)
            except Exception as e:  # noqa: BLE001 - the client re-raises it as is
                reply = (False, e)
            try:
                self.conn.send(reply)
            except (EOFError, OSError):
                return

    def close(self) -> None:
        self.conn.close()  # the thread's recv fails and it ends


class ForwardingDataPlane(IndexedClient):
    """A client of a `memory` plane in another process, over ``conn`` (one end of a pipe whose other
    end a :class:`PlaneServer` serves). Threads of this process may share it: one request at a time."""

    def __init__(self, conn: Any, token_fields: Iterable[str] = DEFAULT_TOKEN_FIELDS,
                 seq_len_field: str = INPUT_IDS) -> None:
        super().__init__(token_fields, seq_len_field)
        self._conn = conn
        self._lock = threading.Lock()

    def _index_call(self, method: str, *args: Any) -> Any:
        with self._lock:
            try:
                self._conn.send((method, args))
                ok, value = self._conn.recv()
            except (EOFError, OSError) as e:
                raise DataPlaneError(
                    f"the data plane's process is gone ({type(e).__name__} on its pipe during {method!r}); "
                    "this worker cannot write or read the run's samples any more"
                ) from None
        if not ok:
            raise value
        return value

    def _store(self, columns: dict[str, Column]) -> dict[str, Any]:
        return {name: share_column(col) for name, col in columns.items()}

    def _fetch(self, plan: LookupPlan) -> dict[str, list[tuple[Column, list[int], list[int]]]]:
        return plan.parts  # the columns came back with the lookup, mapped from shared memory

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._conn.close()

    # Sent to the child once, with its pipe end (the lock is per process).
    def __getstate__(self) -> dict[str, Any]:
        return {"conn": self._conn, "token_fields": self.token_fields, "seq_len_field": self.seq_len_field}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["conn"], state["token_fields"], state["seq_len_field"])


def serve_to_other_process(plane: Any, ctx: Any) -> tuple[ForwardingDataPlane, PlaneServer]:
    """A forwarding client of ``plane`` to send to a child process (of multiprocessing context ``ctx``)
    and the server thread answering it here."""
    here, there = ctx.Pipe(duplex=True)
    return ForwardingDataPlane(there, plane.token_fields, plane.seq_len_field), PlaneServer(plane, here)
