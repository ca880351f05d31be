"""`ray` backend: packed columns in Ray's object store, the key index in one long-lived actor.

Each put stores one object holding its packed columns (numpy arrays, so reads are zero-copy
views of shared memory), or one per part when the writer names its readers' shards
(`put_samples(shards=dp_shard_rows(...))`: across nodes each DP rank then pulls only its own
rows), and sends the refs, never the data, to the `_StoreActor`, which keeps them in its
`PlaneIndex`. A get asks the actor where the rows live (one small call), fetches the
objects and gathers the rows locally. Clearing drops the actor's refs; when the last one goes,
Ray frees the object. Never one object per sample: the per-object overhead would dominate.

A put's round trip overlaps its copy into the object store: the commit (every check, and the
index update with a PENDING payload) is sent first, the columns are copied while the store
answers, and the ref follows in a no-wait `attach`. The writer's own later calls queue behind the
attach (Ray runs one caller's calls to an actor in order); another process that reads the chunk
before the attach arrives (Ray does not order calls across callers) sees PENDING and asks again.

Ownership. Ray 2.56 removed `ray.put(_owner=...)`, so an object is owned by the process that put
it and dies with it. `owner="producer"` (default) accepts that: the driver and the long-lived
worker actors that write are the owners, and the index outlives them all. `owner="store"` makes
the store actor re-put every column it is sent, so data outlives its producer (a rollout worker
that is restarted, say) at the cost of one more copy per put.

Receipts carry locations. A put's receipt (`KVBatchMeta.locations`) holds the refs of the objects it
stored and the chunk id of each field, so a reader handed that meta (a DP rank, say) fetches and
decodes at once while one small `verify` call checks, in parallel, that those chunks are still
the current ones; only if a key was overwritten since does it look up and read again (a cleared
key raises). The lookup's round trip then overlaps the read instead of preceding it.
A receipt's ref keeps its object alive, so every clear or overwrite in a process first drops the
refs of the receipts it holds for those keys (`_forget`): the object goes when the index's ref
goes; a copy of a receipt kept in another process holds its object until dropped.

The client pickles to a handle on the same store actor, so it can be passed to Ray workers as an
argument; `make_data_plane("ray", name=...)` in a worker attaches to a named store instead.

`make_data_plane("ray", index="driver")` (`ray_driver.py`) keeps the same objects and receipts
but the index in the driver's client: no store actor, no round trips, for runs with one driver.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
import weakref
from collections.abc import Iterable
from typing import Any

import numpy as np
import ray

from .client import DEFAULT_TOKEN_FIELDS, IndexedClient, _check_register, _encoded, _resolve
from .codec import Column, from_wire, to_wire
from .columns import INPUT_IDS
from .errors import DataPlaneError, fmt_keys
from .index import PENDING, LookupPlan, Pending, PlaneIndex

__all__ = ["RayDataPlane"]

_PENDING_TIMEOUT_S = 60.0  # a reader gives up on a committed chunk whose data never came


class _Failed:
    """Payload attached when the writer's copy into the object store failed after its commit."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

_INDEX_METHODS = frozenset(
    {"register", "seq_lens", "commit", "lookup", "verify", "list", "describe", "status", "ready", "expected",
     "clear", "num_chunks"}
)


class _Stored:
    """The objects one put stored: `refs[k]` (a dict field -> wire column) holds the put's rows
    `starts[k]:starts[k + 1]`. One object, unless the put was split (`put_samples(shards=...)`) so
    that each reader (a DP rank) fetches only the part it reads: across nodes, only its bytes move."""

    __slots__ = ("refs", "starts")

    def __init__(self, refs: tuple, starts: tuple[int, ...]) -> None:
        self.refs, self.starts = refs, starts

    def __reduce__(self):
        return _Stored, (self.refs, self.starts)

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


def _put_parts(columns: dict[str, Column], bounds: list[int] | None) -> _Stored:
    """The columns in the object store: one object per part of `bounds` (all rows if None)."""
    if bounds is None or len(bounds) <= 2:
        return _Stored((ray.put({name: to_wire(col) for name, col in columns.items()}),), (0,))
    refs = tuple(ray.put({name: to_wire(col.rows(a, b)) for name, col in columns.items()})
                 for a, b in zip(bounds, bounds[1:]))
    return _Stored(refs, tuple(bounds[:-1]))


def _read(wanted: dict[str, list[tuple[_Stored, str, list[int], list[int]]]]) -> dict[str, list]:
    """field -> [(column, rows, positions)] for `wanted` field -> [(stored, name in it, rows, positions)]:
    one batched fetch of only the objects holding those rows (numpy arrays: zero-copy views)."""
    located = {f: [(ref, name, rows, pos) for stored, name, rows_, pos_ in parts
                   for ref, rows, pos in stored.locate(rows_, pos_)] for f, parts in wanted.items()}
    refs = list(dict.fromkeys(ref for parts in located.values() for ref, _, _, _ in parts))
    objs = dict(zip(refs, ray.get(refs)))
    return {f: [(from_wire(objs[ref][name]), rows, pos) for ref, name, rows, pos in parts]
            for f, parts in located.items()}


_PREFETCHES: queue.SimpleQueue = queue.SimpleQueue()  # lists of refs for the prefetch thread
_PREFETCH_THREAD: list = []


def _prefetch(store: str, meta: Any) -> None:
    """Have a helper thread wait, with `fetch_local`, for the objects `meta`'s receipts of `store`
    locate: Ray pulls them to this node meanwhile, and the read that follows finds them here."""
    refs = [ref for loc in meta.locations if isinstance(loc, _Receipt) and loc.store == store
            for ref in (() if loc.stored is None else loc.stored.refs)]
    if not refs:
        return
    if not _PREFETCH_THREAD:
        _PREFETCH_THREAD.append(threading.Thread(target=_prefetch_loop, daemon=True))
        _PREFETCH_THREAD[0].start()
    _PREFETCHES.put(refs)


def _prefetch_loop() -> None:
    while True:
        refs = _PREFETCHES.get()
        try:
            ray.wait(refs, num_returns=len(refs), fetch_local=True)
        except Exception:  # a hint only: the read itself reports what went wrong
            pass
        del refs


class _Receipt:
    """Where one put stored its rows: `stored` (its objects), the index's chunk id of each field,
    and the put's keys in row order. Travels inside `KVBatchMeta.locations`; every copy, in any
    process, is listed in `_RECEIPTS` so that a clear there can drop its refs.

    With the index in the driver (`ray_driver`): `pending` is the commit of a write made in a worker
    (uid, then `PlaneIndex.commit`'s last four arguments), taken into the driver's index when the
    receipt is unpickled there; and a receipt pickled in the driver leaves as a `_Snapshot`."""

    __slots__ = ("store", "pid", "ids", "chunks", "stored", "pending", "_rows", "__weakref__")

    def __init__(self, store: str, pid: str, ids: tuple, chunks: dict[str, int], stored: _Stored | None,
                 pending: tuple | None = None) -> None:
        self.store, self.pid, self.ids, self.chunks, self.stored = store, pid, ids, chunks, stored
        self.pending = pending
        self._rows: dict[str, int] | None = None
        driver = _DRIVERS.get(store)
        if pending is not None and driver is not None:
            driver._absorb(self)  # before it is listed below: the overwrite it makes must not drop it
        with _RECEIPTS_LOCK:
            _RECEIPTS.setdefault((store, pid), weakref.WeakSet()).add(self)

    def __reduce__(self):
        driver = _DRIVERS.get(self.store)
        if driver is not None and self.pending is None:
            return driver._snapshot(self.pid, self.ids)  # leaving the driver: where its keys are now
        return _Receipt, (self.store, self.pid, self.ids, self.chunks, self.stored, self.pending)

    def _outbound(self, meta: Any, memo: dict) -> Any:
        """What a meta carrying this receipt sends when pickled (`KVBatchMeta.__reduce__`)."""
        driver = _DRIVERS.get(self.store)
        if driver is None or self.pending is not None:
            return self
        return driver._outbound(meta, memo)

    def row_of(self) -> dict[str, int]:
        if self._rows is None:
            self._rows = {key: row for row, key in enumerate(self.ids)}
        return self._rows


_RECEIPTS: dict[tuple[str, str], weakref.WeakSet] = {}  # (store, partition) -> this process's live receipts
_RECEIPTS_LOCK = threading.Lock()
# store key -> the client holding that store's index in this process (`ray_driver.RayDriverPlane`).
_DRIVERS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _forget(store: str, pid: str | None, ids: Iterable[str] | None = None, fields: Iterable[str] | None = None) -> None:
    """Drop the refs of this process's receipts whose rows go: a clear of `ids` (all keys if None)
    in `pid` (all partitions if None) drops every receipt holding any of them; an overwrite of
    `fields` of `ids` drops those it replaces whole (one replaced in part still has live rows in
    the index, and a reader's check sees which). A receipt must not keep an object alive after
    the index lets it go."""
    with _RECEIPTS_LOCK:
        for gone in [k for k, v in _RECEIPTS.items() if not v]:  # partitions of past steps
            del _RECEIPTS[gone]
        groups = [list(v) for (st, p), v in _RECEIPTS.items() if st == store and (pid is None or p == pid)]
    keys = None if ids is None else set(ids)
    for receipts in groups:
        for r in receipts:
            if r.stored is None:
                continue
            if fields is None:
                if keys is None or not keys.isdisjoint(r.ids):
                    r.stored = None
            elif r.chunks.keys() <= set(fields) and keys.issuperset(r.ids):
                r.stored = None


class _StoreActor:
    """Holds the `PlaneIndex` (and so every column's ObjectRef). Runs one call at a time."""

    def __init__(self, adopt: bool) -> None:
        self.index = PlaneIndex()
        self.adopt = adopt
        self._deferred: dict[str, DataPlaneError] = {}  # client id -> error of a call it did not wait on
        # Releasing ObjectRefs costs milliseconds (owner/borrower messages); a helper thread does it
        # so that the reply to clear/commit does not wait on it. A sync actor, not an async one:
        # its round trip is shorter.
        self._graveyard: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._bury, daemon=True).start()

    def _bury(self) -> None:
        while True:
            self._graveyard.get()  # the payload list is dropped (and the refs with it) right here

    def call(self, method: str, *args: Any, client: str | None = None) -> Any:
        if client is not None and client in self._deferred:
            raise self._deferred.pop(client)  # a refused no-wait request: its caller hears it now
        if method == "commit" and self.adopt:
            pid, ids, payloads, *rest = args
            # Re-put so this actor owns the objects (they then outlive the producer's process).
            mine = {stored.refs: _Stored(tuple(ray.put(ray.get(ref)) for ref in stored.refs), stored.starts)
                    for stored, _ in payloads.values()}
            payloads = {f: (mine[stored.refs], name) for f, (stored, name) in payloads.items()}
            args = (pid, ids, payloads, *rest)
        try:
            out = getattr(self.index, method)(*args)
            return (*out, self.index.last_chunks) if method == "commit" else out
        finally:
            self._bury_freed()

    def _bury_freed(self) -> None:
        if self.index.freed:
            self._graveyard.put(self.index.freed)
            self.index.freed = []

    def attach(self, pid: str, chunks: dict[str, int], payload: _Stored | _Failed) -> None:
        """The data of a commit answered earlier (one `_Stored` for all of `chunks`' fields)."""
        self.index.attach(pid, chunks, {f: payload if isinstance(payload, _Failed) else (payload, f) for f in chunks})
        self._bury_freed()

    def call_nowait(self, method: str, *args: Any, client: str | None = None) -> None:
        """Fire-and-forget twin of `call`: an error is kept for the client's next `call`. Ray runs
        one caller's calls to an actor in submission order, so that next call comes after this."""
        try:
            self.call(method, *args, client=client)
        except DataPlaneError as err:
            if client is not None:
                note = f"{err} (raised by an earlier {method} that returned without waiting: wait=False)"
                self._deferred.setdefault(client, type(err)(note))

    def ping(self) -> bool:
        return True


def _attach(store: Any, token_fields: frozenset, seq_len_field: str, adopt: bool = False) -> RayDataPlane:
    client = RayDataPlane.__new__(RayDataPlane)
    IndexedClient.__init__(client, token_fields, seq_len_field)
    client._store_actor = store
    client._store_key = store._actor_id.hex()
    client._adopt = adopt
    client._owns_store = False
    client._id = uuid.uuid4().hex
    return client


class _RayObjects:
    """How both ray planes (store-actor index and driver-held index) keep columns: one object per put
    (per part of a split put) holding every column, read back by (object, field) parts."""

    def _store(self, columns: dict[str, Column]) -> dict[str, Any]:
        # One object per put (per part of a split put) holding every column: one ray.put, one ref
        # to track and free. A field's payload is (stored, field); the objects go when the last
        # field pointing into them is released.
        stored = _put_parts(columns, None)
        return {name: (stored, name) for name in columns}

    def _fetch(self, plan: LookupPlan) -> dict[str, list[tuple[Column, list[int], list[int]]]]:
        return _read({f: [(stored, name, rows, pos) for (stored, name), rows, pos in parts]
                      for f, parts in plan.parts.items()})

    def prefetch(self, meta):
        _prefetch(self._store_key, meta)

    def num_objects(self, partition_id: str | None = None) -> int:
        """How many (put, field) chunks the index holds (all partitions if None); 0 once all is cleared."""
        return self._index_call("num_chunks", partition_id)


class RayDataPlane(_RayObjects, IndexedClient):
    """Data plane on Ray's object store. Create it in the driver (after `ray.init`)."""

    def __init__(
        self,
        token_fields: Iterable[str] = DEFAULT_TOKEN_FIELDS,
        seq_len_field: str = INPUT_IDS,
        *,
        name: str | None = None,
        owner: str = "producer",
        attach: bool = False,
    ) -> None:
        """
        Args:
            token_fields: fields stored jagged and padded to a common length on read.
            seq_len_field: the per-token field whose row lengths define a sample's sequence length.
            name: name the store actor (so workers can attach with `attach=True`).
            owner: "producer" (objects owned by whoever puts them) or "store" (the store re-puts and
                owns them, one extra copy per put).
            attach: connect to the existing store actor `name` instead of creating one.
        """
        super().__init__(token_fields, seq_len_field)
        self._id = uuid.uuid4().hex  # names this client to the store (for errors of no-wait calls)
        if not ray.is_initialized():
            raise DataPlaneError("the ray data plane needs a running Ray instance: call ray.init() first")
        if owner not in ("producer", "store"):
            raise DataPlaneError(f"data_plane owner = {owner!r}: use 'producer' or 'store'")
        self._adopt = owner == "store"  # (an attached client learns nothing of it: see _commit)
        if attach:
            if name is None:
                raise DataPlaneError("attach=True needs the store actor's name=")
            self._store_actor = ray.get_actor(name)
            self._store_key = self._store_actor._actor_id.hex()  # names the store in receipts
            self._owns_store = False
            return
        opts: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 1}
        if name is not None:
            opts["name"] = name
        self._store_actor = ray.remote(_StoreActor).options(**opts).remote(owner == "store")
        ray.get(self._store_actor.ping.remote())
        self._store_key = self._store_actor._actor_id.hex()
        self._owns_store = True

    def __reduce__(self):
        # Workers get a client on the same store; only the creating client may kill it.
        return _attach, (self._store_actor, self.token_fields, self.seq_len_field, self._adopt)

    def _index_call(self, method: str, *args: Any) -> Any:
        assert method in _INDEX_METHODS, method
        return self._wait(self._store_actor.call.remote(method, *args, client=self._id))

    def _wait(self, answer: Any) -> Any:
        try:
            return ray.get(answer)
        except ray.exceptions.RayTaskError as err:
            if isinstance(err.cause, DataPlaneError):
                raise err.cause from None
            raise

    def register_partition(self, partition_id, fields, num_samples, *, task_name=None):
        # Validated here, so the store need not answer: saves a round trip per step. The store
        # runs one caller's calls in order, so this caller's next put sees the partition.
        self._check_open()
        args = _check_register(partition_id, fields, num_samples)
        self._store_actor.call_nowait.remote("register", *args, task_name, client=self._id)

    def clear_samples(self, sample_ids, partition_id, *, wait=True):
        self._check_open()
        ids, pid, _ = _resolve(sample_ids, partition_id)
        _forget(self._store_key, pid, ids)  # (a refused clear loses only the receipts' shortcut)
        if wait:
            return self._index_call("clear", pid, ids)
        # The step's final clear: nobody waits on the store's answer (a round trip saved per step).
        self._store_actor.call_nowait.remote("clear", pid, ids, client=self._id)
        return None

    _splits_puts = True

    def _commit(self, pid, ids, columns, *rest, bounds=None):
        if self._adopt:
            # The store re-puts the data, and must have done so before this put returns (the
            # producer may exit right after), so there is nothing to overlap: commit first.
            # No receipt locations: they would point at (and keep alive) the producer's copy.
            _forget(self._store_key, pid, ids, columns)
            stored = _put_parts(_encoded(columns), bounds)
            return (*self._index_call("commit", pid, ids, {f: (stored, f) for f in columns}, *rest)[:3], ())
        answer = self._store_actor.call.remote("commit", pid, ids, {f: PENDING for f in columns}, *rest,
                                               client=self._id)
        try:
            payload = _put_parts(_encoded(columns), bounds)  # encoding and copying while the store answers
        except Exception as err:  # e.g. the object store is full: readers must hear why, not wait
            payload = _Failed(f"{type(err).__name__}: {err}")
        lens, tags, task, chunks = self._wait(answer)  # a refusal raises here; the objects just go
        self._store_actor.attach.remote(pid, chunks, payload)  # (refs inside an argument are not fetched)
        if isinstance(payload, _Failed):
            raise DataPlaneError(f"partition {pid!r}: storing fields {list(columns)} "
                                 f"of keys {fmt_keys(ids)} failed: {payload.reason}")
        _forget(self._store_key, pid, ids, columns)  # receipts of the rows this put replaced
        return lens, tags, task, (_Receipt(self._store_key, pid, tuple(ids), chunks, payload),)

    def get_samples(self, sample_ids, partition_id, select_fields, pad_values=None, pad_to=None):
        self._check_open()
        ids, pid, meta = _resolve(sample_ids, partition_id)
        fields = [select_fields] if isinstance(select_fields, str) else list(select_fields or [])
        located = None if meta is None or not ids or not fields else self._from_receipts(meta, ids, fields)
        if located is None:
            return super().get_samples(sample_ids, partition_id, select_fields, pad_values, pad_to)
        expected, plan = located
        check = self._store_actor.call.remote("verify", pid, ids, expected, client=self._id)
        try:
            parts = _read(plan)  # while the store checks the receipts
        except ray.exceptions.RayError:  # e.g. its owner died: the index's answer says what is left
            return super().get_samples(sample_ids, partition_id, select_fields, pad_values, pad_to)
        try:
            out, err = self._assemble(pid, ids, meta, fields, parts, pad_values, pad_to), None
        except DataPlaneError as e:  # raised only if the receipts were current (else read again)
            out, err = None, e
        if not self._wait(check):  # overwritten since the receipt: read what the index says now
            return super().get_samples(sample_ids, partition_id, select_fields, pad_values, pad_to)
        if err is not None:
            raise err
        return out

    def _from_receipts(self, meta, ids: list[str], fields: list[str]):
        """(expected chunk ids per field, field -> [(stored, field, rows, positions)]) for reading
        `ids` from the receipts `meta` carries, or None if they do not hold every (key, field) asked for."""
        held = [(r, r.stored) for r in meta.locations if isinstance(r, _Receipt)
                and r.store == self._store_key and r.pid == meta.partition_id]
        held = [(r, st) for r, st in held if st is not None]  # (a clear in another thread may drop one)
        if not held:
            return None
        receipts = [r for r, _ in held]
        rows_in = [[r.row_of().get(k) for k in ids] for r in receipts]  # per receipt, per key: row or None
        expected: dict[str, np.ndarray] = {}
        plan: dict[str, list] = {}
        for f in fields:
            # Each key from the last receipt holding it for f (a later put of the key replaced the earlier).
            holders = [i for i, r in enumerate(receipts) if f in r.chunks]
            if not holders:
                return None
            use = [-1] * len(ids)
            for i in holders:
                for p, row in enumerate(rows_in[i]):
                    if row is not None:
                        use[p] = i
            if -1 in use:
                return None
            cids = np.empty(len(ids), dtype=np.int64)
            plan[f] = []
            for i in dict.fromkeys(use):
                pos = [p for p, u in enumerate(use) if u == i]
                cids[pos] = receipts[i].chunks[f]
                plan[f].append((held[i][1], f, [rows_in[i][p] for p in pos], pos))
            expected[f] = cids
        return expected, plan

    def _lookup(self, pid, ids, fields):
        deadline = time.monotonic() + _PENDING_TIMEOUT_S
        while True:
            plan = self._index_call("lookup", pid, ids, fields)
            waiting = [f for f, parts in plan.parts.items() if any(isinstance(p, Pending) for p, _, _ in parts)]
            failed = [(f, p.reason) for f, parts in plan.parts.items() for p, _, _ in parts if isinstance(p, _Failed)]
            if failed:
                raise DataPlaneError(
                    f"partition {pid!r}: field {failed[0][0]!r} of keys {fmt_keys(ids)} was never stored "
                    f"({failed[0][1]}); write it again"
                )
            if not waiting:
                return plan
            if time.monotonic() > deadline:
                raise DataPlaneError(
                    f"partition {pid!r}: fields {waiting} of keys {fmt_keys(ids)} were committed but their "
                    f"data has not arrived in {_PENDING_TIMEOUT_S:.0f} "
                    "s (did the writer die mid-put?); write them again"
                )
            time.sleep(0.001)  # the writer's attach is on its way (a race between two callers)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._owns_store:
            _forget(self._store_key, None)
            ray.kill(self._store_actor)  # drops every ref the index held
        self._store_actor = None
