"""`ray` backend: packed columns in Ray's object store (`ray_objects`), the key index placed by `ray_index`.

A put stores one object of packed columns (or one per reader shard with `shards=`), and the index keeps
the refs; the last ref cleared frees the object. A receipt carries its objects' refs, so a reader fetches
at once while the index verifies the chunks are current. Objects are owned by the process that put them
(`owner="producer"`), or re-put by the store actor (`owner="store"`). With the index in the driver a
worker's meta is a snapshot (`located` / `commit_receipts`); use `index="store"` for several drivers,
workers that read by key, and `owner="store"`. ``docs/architecture.md`` has the details.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import ray

from .client import IndexedClient, check_register, resolve
from .columns import INPUT_IDS
from .errors import DataPlaneError, MissingFieldError, fmt_keys
from .index import PlaneIndex
from .interface import DEFAULT_TOKEN_FIELDS, replace_metas
from .ray_index import DriverIndex, IndexPlacement, StoreIndex
from .ray_objects import Background, Lease, Receipt, ReceiptBook, Snapshot, read_parts

__all__ = ["RayDataPlane"]


def _client(placement: IndexPlacement, token_fields: frozenset, seq_len_field: str) -> RayDataPlane:
    """A pickled `RayDataPlane`: a client of the same index (see `RayDataPlane.__reduce__`)."""
    return RayDataPlane(token_fields, seq_len_field, placement=placement)


class RayDataPlane(IndexedClient):
    """Data plane on Ray's object store. Create it in the driver (after `ray.init`)."""

    _splits_puts = True

    def __init__(
        self,
        token_fields: Iterable[str] = DEFAULT_TOKEN_FIELDS,
        seq_len_field: str = INPUT_IDS,
        *,
        index: str = "store",
        name: str | None = None,
        owner: str = "producer",
        attach: bool = False,
        placement: IndexPlacement | None = None,
    ) -> None:
        """`index`: "store" (actor) or "driver" (this client); `owner`: "producer" or "store" (one extra copy
        per put); `attach`: connect to the store actor `name`; `placement`: reuse one (an unpickled client)."""
        super().__init__(token_fields, seq_len_field)
        self.book = ReceiptBook()  # the receipts whose refs a clear or overwrite drops
        self._background = Background()  # prefetch waits; with the index here, releases of freed objects
        if placement is not None:
            self.placement = placement
            return
        if not ray.is_initialized():
            raise DataPlaneError("the ray data plane needs a running Ray instance: call ray.init() first")
        if owner not in ("producer", "store"):
            raise DataPlaneError(f"data_plane owner = {owner!r}: use 'producer' or 'store'")
        if index == "driver":
            self.placement = DriverIndex(self._background)
        elif attach:
            if name is None:
                raise DataPlaneError("attach=True needs the store actor's name=")
            self.placement = StoreIndex(ray.get_actor(name), owns=False, adopt=owner == "store")
        else:
            self.placement = StoreIndex.start(name, adopt=owner == "store")

    def __reduce__(self):
        # Workers get a client of the same index; only the creating client may kill a store actor.
        return _client, (self.placement.for_worker(), self.token_fields, self.seq_len_field)

    @property
    def _key(self) -> str:
        return self.placement.key

    # ---- index and storage

    def _check_open(self) -> None:
        super()._check_open()
        self.placement.raise_refused()  # a worker's write the driver's index refused: said once, here

    def _index_call(self, method: Callable, *args: Any) -> Any:
        return self.placement.call(method, *args)

    def _commit(self, pid, ids, columns, spec, bounds):
        committed, stored, pending = self.placement.commit(pid, ids, columns, spec, bounds)
        self._background.drop_later(self.book.forget(pid, ids, columns))  # receipts of the rows this put replaced
        if stored is None:
            return committed, ()
        receipt = Receipt(self._key, pid, tuple(ids), committed.chunks, Lease(stored), pending)
        self.book.note(receipt)
        # Held here a while whatever becomes of the receipt: the metas that borrow it usually go first.
        self._background.drop_later([stored])
        return committed, (receipt,)

    def _lookup(self, pid, ids, fields):
        return self.placement.lookup(pid, ids, fields)

    def _fetch(self, plan):
        return read_parts({f: [(stored, name, rows, pos) for (stored, name), rows, pos in parts]
                           for f, parts in plan.parts.items()})

    # ---- interface

    def register_partition(self, partition_id, fields, num_samples, *, task_name=None):
        # Checked here, saving the store a round trip per step.
        self._check_open()
        self.placement.send(PlaneIndex.register, *check_register(partition_id, fields, num_samples), task_name)

    def put_samples(self, sample_ids, partition_id, fields, tags=None, *, seq_lens=None, shards=None):
        meta = super().put_samples(sample_ids, partition_id, fields, tags, seq_lens=seq_lens, shards=shards)
        return self.placement.outgoing(meta)

    def clear_samples(self, sample_ids, partition_id, *, wait=True):
        self._check_open()
        ids, pid, _ = resolve(sample_ids, partition_id)
        self._background.drop_later(self.book.forget(pid, ids))  # (a refused clear loses only the receipts' shortcut)
        if wait:
            return self.placement.call(PlaneIndex.clear, pid, ids)
        return self.placement.send(PlaneIndex.clear, pid, ids)  # a step's final clear: nobody waits on the answer

    def get_samples(self, sample_ids, partition_id, select_fields, pad_values=None, pad_to=None):
        self._check_open()
        ids, pid, meta = resolve(sample_ids, partition_id)
        fields = [select_fields] if isinstance(select_fields, str) else list(select_fields or [])
        if not self.placement.answers_lookups:  # a worker of a driver-held index: the meta is all there is
            return self._read_in_worker(ids, pid, meta, fields, pad_values, pad_to)
        located = None if meta is None or not ids or not fields else self._from_receipts(meta, ids, fields)
        if located is None:
            return super().get_samples(sample_ids, partition_id, select_fields, pad_values, pad_to)
        expected, plan = located
        current = self.placement.verifier(pid, ids, expected)  # the store checks while this reads
        try:
            parts = read_parts(plan)
        except ray.exceptions.RayError:  # e.g. its owner died: the index's answer says what is left
            return super().get_samples(sample_ids, partition_id, select_fields, pad_values, pad_to)
        try:
            out, err = self._assemble(pid, ids, meta, fields, parts, pad_values, pad_to), None
        except DataPlaneError as e:  # raised only if the receipts were current (else read again)
            out, err = None, e
        if not current():  # overwritten since the receipt: read what the index says now
            return super().get_samples(sample_ids, partition_id, select_fields, pad_values, pad_to)
        if err is not None:
            raise err
        return out

    def prefetch(self, meta):
        refs = [ref for loc in meta.locations if isinstance(loc, Receipt) and loc.store == self._key
                for ref in (() if loc.stored is None else loc.stored.refs)]
        if refs:
            self._background.prefetch(refs)

    def located(self, meta):
        return self.placement.located(meta)

    def commit_receipts(self, results):
        """``results`` with each of this plane's receipts in them replaced by the one the index gave back for it
        (a worker's pending write taken), and noted for clears."""
        return replace_metas(results, self._taken)

    def _taken(self, meta):
        locations = []
        for loc in meta.locations:
            if isinstance(loc, Receipt) and loc.store == self._key:
                loc = self.placement.take(loc)
                if loc.stored is not None:
                    self.book.note(loc)
            locations.append(loc)
        return meta.with_locations(locations)

    def num_objects(self, partition_id: str | None = None) -> int:
        """How many (put, field) chunks the index holds (all partitions if None); 0 once all is cleared."""
        return self._index_call(PlaneIndex.num_chunks, partition_id)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.book.forget(None)
        self.placement.close()
        self._background.close()

    # ---- reading by receipts and snapshots

    def _from_receipts(self, meta, ids: list[str], fields: list[str]):
        """(expected chunk ids per field, field -> [(stored, field, rows, positions)]) from `meta`'s receipts,
        or None if they do not hold every (key, field) asked for."""
        held = [(r, r.stored) for r in meta.locations if isinstance(r, Receipt)
                and r.store == self._key and r.pid == meta.partition_id]
        held = [(r, st) for r, st in held if st is not None]  # (a clear in another thread may drop one)
        if not held:
            return None
        receipts = [r for r, _ in held]
        rows_in = [[rows.get(k) for k in ids] for rows in (r.row_of() for r in receipts)]  # per receipt, per key
        expected: dict[str, np.ndarray] = {}
        plan: dict[str, list] = {}
        for f in fields:
            # Each key from the last receipt holding it for f.
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

    def _read_in_worker(self, ids, pid, meta, fields, pad_values, pad_to):
        """A worker's read of a driver-held index: from the snapshot and receipts the meta carries."""
        if meta is None:
            raise DataPlaneError(
                f"partition {pid!r}: data_plane index = 'driver': a worker reads by a meta the driver sent "
                f"it, not by a list of keys ({fmt_keys(ids)}); pass the meta (or use index='store')"
            )
        if not fields:
            raise MissingFieldError(f"partition {pid!r}: select_fields is empty; name the fields to fetch")
        parts = read_parts(self._worker_plan(meta, ids, fields))
        return self._assemble(pid, ids, meta, fields, parts, pad_values, pad_to)

    def _worker_plan(self, meta, ids: list[str], fields: list[str]) -> dict[str, list]:
        """field -> [(stored, name, rows, positions)] from `meta`'s snapshots and receipts (later wins)."""
        sources = [loc for loc in meta.locations if isinstance(loc, (Snapshot, Receipt))
                   and loc.store == self._key and loc.pid == meta.partition_id
                   and (isinstance(loc, Snapshot) or loc.stored is not None)]
        n = len(ids)
        at = []
        for src in sources:
            rows = src.row_of()
            at.append(np.fromiter((rows.get(k, -1) for k in ids), dtype=np.int64, count=n))
        plan: dict[str, list] = {}
        for f in fields:
            use = np.full(n, -1, dtype=np.int64)  # per key: which source
            for i, (src, pos) in enumerate(zip(sources, at)):
                has = pos >= 0
                if isinstance(src, Snapshot):
                    entry = src.where.get(f)
                    if entry is None:
                        continue
                    has &= entry[1][np.maximum(pos, 0)] >= 0
                elif f not in src.chunks:
                    continue
                use[has] = i
            if (use < 0).any():
                _raise_unlocated(meta, [ids[p] for p in np.nonzero(use < 0)[0].tolist()], f, sources)
            plan[f] = []
            for i in np.unique(use).tolist():
                src, pos_out = sources[i], np.nonzero(use == i)[0]
                rows = at[i][pos_out]
                if isinstance(src, Receipt):
                    plan[f].append((src.stored, f, rows.tolist(), pos_out.tolist()))
                    continue
                payloads, which, in_payload = src.where[f]
                for k in np.unique(which[rows]).tolist():
                    sel = which[rows] == k
                    stored, name = payloads[k]
                    plan[f].append((stored, name, in_payload[rows[sel]].tolist(), pos_out[sel].tolist()))
        return plan


def _raise_unlocated(meta, keys: list[str], field: str, sources: list) -> None:
    for src in sources:
        if isinstance(src, Snapshot) and src.gone is not None:
            rows = [r for r in (src.row_of().get(k) for k in keys) if r is not None]
            # A key that was live then had some field written; one with none was not live.
            if any(all(which[r] < 0 for _, which, _ in src.where.values()) for r in rows):
                raise type(src.gone)(f"{src.gone} (in the driver, before it sent this meta)")
    raise MissingFieldError(
        f"partition {meta.partition_id!r}: field {field!r} of keys {fmt_keys(keys)} is not in the locations "
        "this meta carries; with data_plane index = 'driver' a worker reads only what was written before "
        "the driver sent it the meta (or its own writes): send the meta after the write"
    )
