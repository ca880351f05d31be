"""A `memory` plane used from a child process: index calls forwarded, columns in shared memory.

The child's :class:`ForwardingDataPlane` encodes and pads like any `IndexedClient` and sends each index call
over a pipe to a :class:`PlaneServer` thread in the plane's process (one call at a time). Large columns
cross as shared-memory handles (no copy in the parent), small ones by value; the server never decodes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import torch

from rlplane.utils.shared_pickle import SMALL_TENSOR_BYTES, dumps

from .client import IndexedClient, encoded
from .codec import Column
from .columns import INPUT_IDS
from .errors import DataPlaneError
from .index import LookupPlan, PlaneIndex, remote_method
from .interface import DEFAULT_TOKEN_FIELDS

__all__ = ["ForwardingDataPlane", "PlaneServer", "share_column"]

def _for_the_pipe(t: torch.Tensor, owned: bool) -> torch.Tensor:
    """``t`` ready for the pipe: small ones by value, large ones in shared memory (moved in place only when
    ``owned`` and it owns its whole storage, else copied: a stored column may be in a reader's hands)."""
    if t.is_shared() or t.numel() * t.element_size() <= SMALL_TENSOR_BYTES:
        return t
    whole = t.untyped_storage().nbytes() == t.numel() * t.element_size() and t.storage_offset() == 0
    return (t if owned and whole else t.clone()).share_memory_()


def share_column(col: Column, owned: bool = True) -> Column:
    """The column ready to cross the pipe (:func:`_for_the_pipe`)."""
    return Column(_for_the_pipe(col.values, owned), None if col.offsets is None else _for_the_pipe(col.offsets, owned))


def _shareable(plan: LookupPlan) -> LookupPlan:
    """The plan with its columns ready to cross the pipe (copied, not moved: the plane keeps them)."""
    parts = {f: [(share_column(col, owned=False), rows, pos) for col, rows, pos in field_parts]
             for f, field_parts in plan.parts.items()}
    return LookupPlan(parts)


class PlaneServer:
    """Serves one forwarding client's index calls on ``plane`` in a daemon thread, until the connection closes."""

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
                call = remote_method(method)
                result = self.plane._index_call(call, *args)
                if call is PlaneIndex.lookup:
                    result = _shareable(result)
                reply = (True, result)
            except Exception as e:  # noqa: BLE001 - the client re-raises it as is
                reply = (False, e)
            try:
                self.conn.send_bytes(dumps(reply))
            except (EOFError, OSError):
                return

    def close(self) -> None:
        self.conn.close()  # the thread's recv fails and it ends


class ForwardingDataPlane(IndexedClient):
    """A client of a `memory` plane in another process over ``conn``; threads share it, one request at a time."""

    def __init__(self, conn: Any, token_fields: Iterable[str] = DEFAULT_TOKEN_FIELDS,
                 seq_len_field: str = INPUT_IDS) -> None:
        super().__init__(token_fields, seq_len_field)
        self._conn = conn
        self._lock = threading.Lock()

    def _index_call(self, method: Callable, *args: Any) -> Any:
        with self._lock:
            try:
                self._conn.send_bytes(dumps((method.__name__, args)))  # the name crosses; the server's is the method
                ok, value = self._conn.recv()
            except (EOFError, OSError) as e:
                raise DataPlaneError(
                    f"the data plane's process is gone ({type(e).__name__} on its pipe during {method.__name__!r}); "
                    "this worker cannot write or read the run's samples any more"
                ) from None
        if not ok:
            raise value
        return value

    def _commit(self, pid, ids, columns, spec, bounds):
        shared = {name: share_column(col) for name, col in encoded(columns).items()}
        return self._index_call(PlaneIndex.commit, pid, ids, shared, spec), ()

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
    """A forwarding client of ``plane`` for a child process (context ``ctx``), and the server thread here."""
    here, there = ctx.Pipe(duplex=True)
    return ForwardingDataPlane(there, plane.token_fields, plane.seq_len_field), PlaneServer(plane, here)
