"""`ray` backend with the key index in the driver: `make_data_plane("ray", index="driver")`.

For runs with one driver, whose workers (DP ranks, a rollout worker) read what the driver hands
them and hand their writes back. The columns live in Ray's object store as with the store actor
(`ray_backend`: same objects, same receipts), but the `PlaneIndex` lives in the driver's client, so
no read or write makes a round trip to an actor that, on a machine of few cores, competes with the
workers for them.

How a worker does without the index:

- reads: a meta that leaves the driver (pickled to a worker) carries, in place of its receipts,
  where each written field of its keys is at that moment (one `_Snapshot`: the index's current
  answer, so a key overwritten since the put is read as it is now, a cleared one raises). The
  worker fetches those objects and gathers its rows: no call. A read of a key or field the
  snapshot lacks raises, saying why. (`meta_for` metas carry an empty one, filled as they leave.)
  A snapshot is good for one hop: a meta a worker passes on (to the driver, or to another worker)
  carries it empty, and the worker's own receipts in full.
- writes: the worker stores its objects and returns a receipt carrying the commit (`pending`);
  when that receipt is unpickled in the driver (the worker's return value, fetched by `ray.get`),
  the driver's index takes it, with every check a commit makes. A write the index refuses (a key
  cleared meanwhile, an unregistered field) is raised by the driver's next data-plane call. A
  worker's write that never reaches the driver is not in the index: a worker returns its receipts.
- everything else (register, clear, list, status, a read by key list) is the driver's: a
  worker's call raises, naming it.

A meta a worker holds is a snapshot: if the driver overwrites or clears its keys after sending it,
the worker does not hear of it (the store actor's `verify` would catch that; with one driver that
sends each step's metas after its writes, nothing does it). Use `index="store"` (`make_data_plane`'s
default) for several drivers, for workers that read by key, and for `owner="store"`. A run's
`data_plane.index: auto` picks this one when the recipe's driver owns every key (`config/plan.py`).
"""

from __future__ import annotations

import queue
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import numpy as np
import ray

from .client import DEFAULT_TOKEN_FIELDS, IndexedClient, _encoded, _resolve
from .columns import INPUT_IDS
from .errors import DataPlaneError, MissingFieldError, fmt_keys
from .index import PlaneIndex
from .ray_backend import _DRIVERS, RayDataPlane, _forget, _put_parts, _RayObjects, _read, _Receipt

__all__ = ["RayDriverPlane"]

_ABSORBED_KEPT = 4096  # uids of taken write-backs remembered (a receipt fetched twice is taken once)


class _Snapshot:
    """Where the keys `ids` had each written field when their receipt left the driver:
    `where[field] = (payloads, payload index per key or -1, row per key)`, and `gone`, the error
    a read of the keys that were not live then raises (None if all were)."""

    __slots__ = ("store", "pid", "ids", "where", "gone", "outbound", "_rows")

    def __init__(self, store: str, pid: str, ids: tuple, where: dict, gone: DataPlaneError | None,
                 outbound: bool = False) -> None:
        if store in _DRIVERS and not outbound:
            # Back in the driver (inside a worker's write-back meta): the index knows better, and
            # refs held here would keep objects alive after the index clears them.
            where, gone = {}, None
        self.store, self.pid, self.ids, self.where, self.gone = store, pid, ids, where, gone
        self.outbound = outbound  # made by the driver for a meta being pickled: sent as it is
        self._rows: dict[str, int] | None = None

    def __reduce__(self):
        driver = _DRIVERS.get(self.store)
        if driver is not None and not self.outbound:
            return driver._snapshot(self.pid, self.ids)  # never send a stale one from the driver
        if driver is None:
            # Good for one hop: from a worker it goes on empty. Its usual way is back to the driver
            # (in a write-back's meta), which has no use for it, and its refs would cost a borrow
            # round trip with their owner per step; a worker reads the metas the driver sends it.
            return _Snapshot, (self.store, self.pid, (), {}, None)
        return _Snapshot, (self.store, self.pid, self.ids, self.where, self.gone)

    def _outbound(self, meta, memo: dict):
        driver = _DRIVERS.get(self.store)
        return self if driver is None else driver._outbound(meta, memo)

    def row_of(self) -> dict[str, int]:
        if self._rows is None:
            self._rows = {key: row for row, key in enumerate(self.ids)}
        return self._rows


_GRAVEYARD: queue.SimpleQueue = queue.SimpleQueue()
_GRAVEDIGGER: list = []


def _bury(payloads: list) -> None:
    """Drop `payloads` (and the last refs of their objects) in a helper thread: a release costs
    owner/borrower messages the caller need not wait on."""
    if not _GRAVEDIGGER:
        _GRAVEDIGGER.append(threading.Thread(target=_dig, daemon=True))
        _GRAVEDIGGER[0].start()
    _GRAVEYARD.put(payloads)


def _dig() -> None:
    while True:
        _GRAVEYARD.get()  # the list is dropped right here


def _worker_copy(store: str, token_fields: frozenset, seq_len_field: str) -> RayDriverPlane:
    """The client a pickled `RayDriverPlane` becomes: the driver's own in its process, else a worker's."""
    driver = _DRIVERS.get(store)
    if driver is not None:
        return driver
    client = RayDriverPlane.__new__(RayDriverPlane)
    IndexedClient.__init__(client, token_fields, seq_len_field)
    client._setup(store, None)
    return client


class RayDriverPlane(_RayObjects, IndexedClient):
    """Data plane on Ray's object store with the index in this (the driver's) process."""

    _splits_puts = True

    def __init__(self, token_fields: Iterable[str] = DEFAULT_TOKEN_FIELDS, seq_len_field: str = INPUT_IDS) -> None:
        super().__init__(token_fields, seq_len_field)
        if not ray.is_initialized():
            raise DataPlaneError("the ray data plane needs a running Ray instance: call ray.init() first")
        self._setup(f"driver:{uuid.uuid4().hex}", PlaneIndex())
        _DRIVERS[self._store_key] = self

    def _setup(self, store_key: str, index: PlaneIndex | None) -> None:
        self._store_key = store_key  # names this plane in receipts
        self._index = index  # None in a worker
        self._lock = threading.RLock()  # index calls one at a time (threads; unpickling a receipt)
        self._absorbed: OrderedDict[str, dict[str, int]] = OrderedDict()  # write-back uid -> its chunk ids
        self._refused: DataPlaneError | None = None  # a worker's write the index refused, raised next call

    def __reduce__(self):
        return _worker_copy, (self._store_key, self.token_fields, self.seq_len_field)

    # ---- the index: here in the driver, nowhere in a worker -------------------------------------

    def _check_open(self) -> None:
        super()._check_open()
        if self._refused is not None:
            err, self._refused = self._refused, None
            raise err

    def _index_call(self, method: str, *args: Any) -> Any:
        if self._index is None:
            raise DataPlaneError(
                f"data_plane index = 'driver': the {method!r} request is answered by the driver only; a worker "
                "reads the metas the driver hands it and writes under them (or use index='store')"
            )
        with self._lock:
            out = getattr(self._index, method)(*args)
            freed, self._index.freed = self._index.freed, []
        if freed:
            _bury(freed)
        return out

    def _absorb(self, receipt: _Receipt) -> None:
        """Commit a worker's write (`receipt.pending`) to this index, as the store actor would have."""
        uid, *rest = receipt.pending
        receipt.pending = None
        with self._lock:
            chunks = self._absorbed.get(uid)
            if chunks is None:
                payloads = {f: (receipt.stored, f) for f in receipt.chunks}
                try:
                    self._index_call("commit", receipt.pid, list(receipt.ids), payloads, *rest)
                except DataPlaneError as err:
                    receipt.stored = None
                    self._refused = type(err)(f"{err} (a worker's write, refused when its receipt reached the driver)")
                    return
                chunks = self._absorbed[uid] = dict(self._index.last_chunks)
                if len(self._absorbed) > _ABSORBED_KEPT:
                    self._absorbed.popitem(last=False)
                _forget(self._store_key, receipt.pid, receipt.ids, chunks)  # receipts it replaced whole
        receipt.chunks = dict(chunks)

    def _outbound(self, meta, memo: dict) -> _Snapshot | None:
        """The one location a meta leaving the driver carries for this plane: where each of its
        keys' fields is now (its receipts, current or stale, and older snapshots all go into it)."""
        if self._store_key in memo:
            return None
        memo[self._store_key] = True
        with self._lock:
            where, gone = self._index.locate(meta.partition_id, meta.sample_ids)
        return _Snapshot(self._store_key, meta.partition_id, meta.sample_ids, where, gone, outbound=True)

    def _snapshot(self, pid: str, ids: tuple) -> tuple:
        """A pickled `_Snapshot` of where `ids`' fields are now (`__reduce__`'s answer)."""
        with self._lock:
            where, gone = self._index.locate(pid, ids)
        return _Snapshot, (self._store_key, pid, ids, where, gone)

    # ---- writes ----------------------------------------------------------------------------------

    def _commit(self, pid, ids, columns, *rest, bounds=None):
        stored = _put_parts(_encoded(columns), bounds)  # (a refused commit drops the objects)
        if self._index is None:  # a worker: the driver's index takes the commit with the receipt
            token_lens, lens, _, tags = rest
            _forget(self._store_key, pid, ids, columns)  # this worker's receipts of the rows it replaces
            receipt = _Receipt(self._store_key, pid, tuple(ids), {f: -1 for f in columns}, stored,
                               pending=(uuid.uuid4().hex, *rest))
            out_lens = [None] * len(ids) if lens is None else [int(x) for x in lens]
            return out_lens, tags, None, (receipt,)
        with self._lock:
            out = self._index_call("commit", pid, ids, {f: (stored, f) for f in columns}, *rest)
            chunks = dict(self._index.last_chunks)
        _forget(self._store_key, pid, ids, columns)  # receipts of the rows this put replaced
        return (*out, (_Receipt(self._store_key, pid, tuple(ids), chunks, stored),))

    def meta_for(self, partition_id, sample_ids=None):
        meta = super().meta_for(partition_id, sample_ids)
        # No receipt says where these keys are: an empty snapshot, so that the meta sends one.
        return meta._derive(locations=(_Snapshot(self._store_key, partition_id, meta.sample_ids, {}, None),))

    def clear_samples(self, sample_ids, partition_id, *, wait=True):
        self._check_open()
        ids, pid, _ = _resolve(sample_ids, partition_id)
        if self._index is not None:
            _forget(self._store_key, pid, ids)
        return self._index_call("clear", pid, ids)  # local: `wait` changes nothing

    # ---- reads -----------------------------------------------------------------------------------

    def get_samples(self, sample_ids, partition_id, select_fields, pad_values=None, pad_to=None):
        self._check_open()
        ids, pid, meta = _resolve(sample_ids, partition_id)
        fields = [select_fields] if isinstance(select_fields, str) else list(select_fields or [])
        if self._index is None:
            if meta is None:
                raise DataPlaneError(
                    f"partition {pid!r}: data_plane index = 'driver': a worker reads by a meta the driver sent "
                    f"it, not by a list of keys ({fmt_keys(ids)}); pass the meta (or use index='store')"
                )
            if not fields:
                raise MissingFieldError(f"partition {pid!r}: select_fields is empty; name the fields to fetch")
            parts = _read(self._worker_plan(meta, ids, fields))
            return self._assemble(pid, ids, meta, fields, parts, pad_values, pad_to)
        located = None
        if meta is not None and ids and fields:
            located = RayDataPlane._from_receipts(self, meta, ids, fields)  # (uses only `_store_key`)
        if located is not None:
            expected, plan = located
            if self._index_call("verify", pid, ids, expected):  # local: a few numpy compares
                return self._assemble(pid, ids, meta, fields, _read(plan), pad_values, pad_to)
        return super().get_samples(sample_ids, partition_id, select_fields, pad_values, pad_to)

    def _worker_plan(self, meta, ids: list[str], fields: list[str]) -> dict[str, list]:
        """field -> [(stored, name, rows, positions)] from the snapshots and receipts `meta` carries
        (later ones win for a (key, field) both hold); raises for any (key, field) none holds."""
        sources = [loc for loc in meta.locations if isinstance(loc, (_Snapshot, _Receipt))
                   and loc.store == self._store_key and loc.pid == meta.partition_id
                   and (isinstance(loc, _Snapshot) or loc.stored is not None)]
        n = len(ids)
        at = [np.fromiter((src.row_of().get(k, -1) for k in ids), dtype=np.int64, count=n) for src in sources]
        plan: dict[str, list] = {}
        for f in fields:
            use = np.full(n, -1, dtype=np.int64)  # per key: which source
            for i, (src, pos) in enumerate(zip(sources, at)):
                has = pos >= 0
                if isinstance(src, _Snapshot):
                    entry = src.where.get(f)
                    if entry is None:
                        continue
                    has &= entry[1][np.maximum(pos, 0)] >= 0
                elif f not in src.chunks:
                    continue
                use[has] = i
            if (use < 0).any():
                self._raise_unlocated(meta, [ids[p] for p in np.nonzero(use < 0)[0].tolist()], f, sources)
            plan[f] = []
            for i in np.unique(use).tolist():
                src, pos_out = sources[i], np.nonzero(use == i)[0]
                rows = at[i][pos_out]
                if isinstance(src, _Receipt):
                    plan[f].append((src.stored, f, rows.tolist(), pos_out.tolist()))
                    continue
                payloads, which, in_payload = src.where[f]
                for k in np.unique(which[rows]).tolist():
                    sel = which[rows] == k
                    stored, name = payloads[k]
                    plan[f].append((stored, name, in_payload[rows[sel]].tolist(), pos_out[sel].tolist()))
        return plan

    def _raise_unlocated(self, meta, keys: list[str], field: str, sources: list) -> None:
        for src in sources:
            if isinstance(src, _Snapshot) and src.gone is not None:
                rows = [r for r in (src.row_of().get(k) for k in keys) if r is not None]
                # A key that was live then had some field written; one with none was not live.
                if any(all(which[r] < 0 for _, which, _ in src.where.values()) for r in rows):
                    raise type(src.gone)(f"{src.gone} (in the driver, before it sent this meta)")
        raise MissingFieldError(
            f"partition {meta.partition_id!r}: field {field!r} of keys {fmt_keys(keys)} is not in the locations "
            "this meta carries; with data_plane index = 'driver' a worker reads only what was written before "
            "the driver sent it the meta (or its own writes): send the meta after the write"
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._index is not None:
            _DRIVERS.pop(self._store_key, None)
            _forget(self._store_key, None)
            with self._lock:
                self._index = PlaneIndex()  # drops every ref the index held
