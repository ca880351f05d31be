"""What the `ray` data plane keeps in Ray's object store, and the plain data that says where.

A put's `Stored` objects (numpy, zero-copy reads) are named by its `Receipt` in `KVBatchMeta.locations`;
a driver-held index hands workers a `Snapshot` instead. Receipts are frozen: a receipt that changes (a worker's
write the driver's index took) is replaced by a new one. A receipt holds its objects through a `Lease`, which a
client's `ReceiptBook` ends on a clear or overwrite of its rows, so the objects go while metas carrying the
receipt live on; releases run on a `Background` thread.
"""

from __future__ import annotations

import collections
import dataclasses
import queue
import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any

import numpy as np
import ray

from .codec import Column, from_wire, to_wire
from .errors import DataPlaneError
from .index import WriteSpec

# How long a client keeps the refs of what it put, and of objects whose rows went (Background.drop_later): past
# the borrowers' release when steps are short (the rows of a step are cleared a step or two after their put).
RELEASE_GRACE_S = 2.0

__all__ = ["Background", "Failed", "Lease", "Receipt", "ReceiptBook", "Snapshot", "Stored", "WriteBack", "put_parts",
           "read_parts"]


@dataclasses.dataclass(frozen=True)
class Stored:
    """The objects of one put: `refs[k]` (field -> wire column) holds rows `starts[k]:starts[k + 1]`.

    Several only when the put was split by reader shards, so each DP rank fetches only its own bytes."""

    refs: tuple
    starts: tuple[int, ...]

    def locate(self, rows: list[int], pos: list[int]) -> list[tuple[Any, list[int], list[int]]]:
        """[(ref, rows in that object, output positions)] for the put's `rows` (read to `pos`)."""
        if len(self.refs) == 1:
            return [(self.refs[0], rows, pos)]
        r, p = np.asarray(rows, dtype=np.int64), np.asarray(pos, dtype=np.int64)
        part = np.searchsorted(self.starts, r, side="right") - 1
        out = []
        for k in np.unique(part).tolist():
            sel = part == k
            out.append((self.refs[k], (r[sel] - self.starts[k]).tolist(), p[sel].tolist()))
        return out


@dataclasses.dataclass(frozen=True)
class Failed:
    """Payload attached when the writer's copy into the object store failed after its commit."""

    reason: str


def put_parts(columns: dict[str, Column], bounds: list[int] | None) -> Stored:
    """The columns in the object store: one object per part of `bounds` (all rows if None)."""
    if bounds is None or len(bounds) <= 2:
        return Stored((ray.put({name: to_wire(col) for name, col in columns.items()}),), (0,))
    refs = tuple(ray.put({name: to_wire(col.rows(a, b)) for name, col in columns.items()})
                 for a, b in zip(bounds, bounds[1:]))
    return Stored(refs, tuple(bounds[:-1]))


def read_parts(wanted: dict[str, list[tuple[Stored, str, list[int], list[int]]]]) -> dict[str, list]:
    """field -> [(column, rows, positions)] for `wanted` field -> [(stored, name, rows, positions)]: one fetch."""
    located = {f: [(ref, name, rows, pos) for stored, name, rows_, pos_ in parts
                   for ref, rows, pos in stored.locate(rows_, pos_)] for f, parts in wanted.items()}
    refs = list(dict.fromkeys(ref for parts in located.values() for ref, _, _, _ in parts))
    objs = dict(zip(refs, ray.get(refs)))
    return {f: [(from_wire(objs[ref][name]), rows, pos) for ref, name, rows, pos in parts]
            for f, parts in located.items()}


@dataclasses.dataclass(frozen=True)
class WriteBack:
    """A write made where the index is not: what the index's commit takes, with a uid so it commits once."""

    uid: str
    spec: WriteSpec


class Lease:
    """A receipt's hold on its put's objects: ``stored`` until the client holding the receipt ends it (its keys
    cleared or its fields overwritten here), after which the objects can go though the receipt lives on. The one
    part of a receipt that changes, in one place (:meth:`end`); a copy sent to another process holds its own."""

    __slots__ = ("stored",)

    def __init__(self, stored: Stored | None):
        self.stored = stored

    def end(self) -> Stored | None:
        """No objects from here on; what it held, for whoever keeps the refs a little longer."""
        stored, self.stored = self.stored, None
        return stored

    def __reduce__(self):
        return Lease, (self.stored,)


@dataclasses.dataclass(frozen=True, eq=False)
class Receipt:
    """Where one put stored its rows: its objects (through ``lease``; `stored` is None once they went), each
    field's chunk id (-1 until a `pending` write is taken, which replaces the receipt), the keys in row order,
    and the owning index `store`."""

    store: str
    pid: str
    ids: tuple
    chunks: dict[str, int]
    lease: Lease
    pending: WriteBack | None = None

    @property
    def stored(self) -> Stored | None:
        return self.lease.stored

    def taken(self, chunks: dict[str, int]) -> Receipt:
        """This receipt once the index took its pending write as ``chunks``: a new one, same objects."""
        return dataclasses.replace(self, chunks=dict(chunks), pending=None)

    def refused(self) -> Receipt:
        """This receipt once the index refused its pending write: no objects (they go), nothing pending."""
        self.lease.end()
        return dataclasses.replace(self, pending=None)

    def row_of(self) -> dict[str, int]:
        return {key: row for row, key in enumerate(self.ids)}


@dataclasses.dataclass(eq=False)
class Snapshot:
    """Where keys `ids` had each field when handed out: `where[field] = (payloads, payload index or -1, row)`;
    `gone`: the error a read of keys not live then raises (None if all were)."""

    store: str
    pid: str
    ids: tuple
    where: dict
    gone: DataPlaneError | None

    def row_of(self) -> dict[str, int]:
        return {key: row for row, key in enumerate(self.ids)}


class ReceiptBook:
    """The receipts one client holds refs through, by partition (weakly: a receipt nobody holds goes)."""

    def __init__(self) -> None:
        self._by_pid: dict[str, weakref.WeakSet] = {}
        self._lock = threading.Lock()  # threads of one process share a client

    def note(self, receipt: Receipt) -> None:
        with self._lock:
            self._by_pid.setdefault(receipt.pid, weakref.WeakSet()).add(receipt)

    def forget(self, pid: str | None, ids: Iterable[str] | None = None,
               fields: Iterable[str] | None = None) -> list[Stored]:
        """End the receipts whose rows go (every receipt holding a cleared key, and those an overwrite of
        `fields` replaces whole; `pid`/`ids` None = all); their objects, whose refs the caller lets go."""
        with self._lock:
            for gone in [p for p, v in self._by_pid.items() if not v]:  # partitions of past steps
                del self._by_pid[gone]
            groups = [list(v) for p, v in self._by_pid.items() if pid is None or p == pid]
        keys = None if ids is None else set(ids)
        ended = []
        for receipts in groups:
            for r in receipts:
                if r.stored is None:
                    continue
                if fields is None:
                    if keys is None or not keys.isdisjoint(r.ids):
                        ended.append(r.lease.end())
                elif r.chunks.keys() <= set(fields) and keys.issuperset(r.ids):
                    ended.append(r.lease.end())
        return ended


class Background:
    """One lazy daemon thread for what need not be waited on: releasing refs, `fetch_local` of prefetches.

    A client keeps a ref to what it put for :data:`RELEASE_GRACE_S`, and lets go of objects whose rows went that
    long after they went (:meth:`drop_later`). Ray keeps a placeholder per object for good in the owner's
    in-process store when the owner lets go of an object first and a borrower (the store actor's index, a meta
    in another process) after it: one entry a put, the Ray actors' memory creep (docs/benchmarks.md). Let go
    after the borrowers, an object leaves no trace.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def drop(self, payloads: list) -> None:
        """Let `payloads` (and the refs inside) go on the thread, not here."""
        self._submit(False, payloads)

    def drop_later(self, payloads: list) -> None:
        """Let `payloads` go :data:`RELEASE_GRACE_S` from now, on the thread (at once when it closes)."""
        if payloads:
            self._submit("later", (time.monotonic() + RELEASE_GRACE_S, payloads))

    def prefetch(self, refs: list) -> None:
        self._submit(True, refs)

    def _submit(self, kind: bool | str | None, item: Any) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="data-plane-background", daemon=True)
            self._thread.start()
        self._queue.put((kind, item))

    def _run(self) -> None:
        due: collections.deque[tuple[float, list]] = collections.deque()  # in submission order = due order
        while True:
            wait = max(0.0, due[0][0] - time.monotonic()) if due else None
            try:
                kind, item = self._queue.get(timeout=wait)
            except queue.Empty:
                kind, item = False, None
            now = time.monotonic()
            while due and due[0][0] <= now:
                due.popleft()  # its refs go here
            if kind is None:
                return  # closed: what was due later goes with `due`
            if kind == "later":
                due.append(item)
            elif kind:
                try:
                    ray.wait(item, num_returns=len(item), fetch_local=True)
                except Exception:  # noqa: BLE001 - a hint only: the read itself reports what went wrong
                    pass
            del item  # a dropped payload's refs go right here

    def close(self) -> None:
        if self._thread is not None:
            self._submit(None, None)
            self._thread = None
