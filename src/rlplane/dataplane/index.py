"""The key -> (chunk, row) index: which keys and fields exist, no tensor data.

Chunk payloads are opaque (a `Column` in memory, an `ObjectRef` under Ray) and reference-counted: the last
(key, field) released drops the chunk. Mutations validate the whole request first, so a raise changes
nothing. Per field one (2, capacity) int64 array holds (chunk id, row) by key slot, -1 where not written,
so a request costs one dict look-up per key plus numpy ops (`partition.Partition`, O(live keys)).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .errors import (
    ClearedKeyError,
    DataPlaneError,
    MissingFieldError,
    MissingKeyError,
    ShapeError,
    UnknownPartitionError,
    fmt_keys,
)
from .partition import PENDING, Partition, Pending

__all__ = ["PENDING", "Committed", "LookupPlan", "Pending", "PlaneIndex", "WriteSpec"]


@dataclasses.dataclass(frozen=True)
class WriteSpec:
    """What a put states about its rows, checked by `PlaneIndex.commit` against what is stored.

    seq_lens: None if unknown; if `seq_lens_explicit` they must equal stored lengths, else derived from the
    token fields and a stored length wins. tags: one dict per key to merge, or None."""

    token_lens: dict[str, Any]
    seq_lens: Sequence[int] | None
    seq_lens_explicit: bool
    tags: list[dict] | None


@dataclasses.dataclass(frozen=True)
class Committed:
    """A commit's answer: stored seq lengths (None where unknown), tags (None if none), task name, new chunk ids."""

    seq_lens: list[int | None]
    tags: list[dict] | None
    task_name: str | None
    chunks: dict[str, int]


@dataclasses.dataclass
class LookupPlan:
    """Where each requested field's rows live: field -> [(payload, rows in chunk, output positions)]."""

    parts: dict[str, list[tuple[Any, list[int], list[int]]]]  # (the reader has the rest in its meta)


def _lens_out(arr: np.ndarray) -> list[int | None]:
    return [None if x < 0 else x for x in arr.tolist()]


class PlaneIndex:
    """Partitions, keys, per-(key, field) locations and production status."""

    def __init__(self) -> None:
        self._parts: dict[str, Partition] = {}
        self._chunk_ids = itertools.count()
        # Payloads whose last row was released; their owner drops them (Ray: after replying).
        self.freed: list[Any] = []

    # ---- partitions

    def register(self, pid: str, fields: Sequence[str], num_samples: int, task_name: str | None) -> None:
        """Create `pid`, or widen its field list. An empty partition starts afresh (tombstones go)."""
        fields = list(dict.fromkeys(fields))
        if not fields:
            raise DataPlaneError(f"partition {pid!r}: register_partition needs at least one field name")
        if num_samples < 0:
            raise DataPlaneError(f"partition {pid!r}: num_samples = {num_samples}; it must be >= 0")
        part = self._parts.get(pid)
        if part is None or not part.slot_of:
            if part is not None:
                self.freed.extend(p for p, _ in part.chunks.values())
            self._parts[pid] = Partition(fields, num_samples, task_name)
            return
        part.fields.extend(f for f in fields if f not in part.fields)
        part.num_samples = max(part.num_samples, num_samples)
        part.task_name = task_name if task_name is not None else part.task_name

    def partition(self, pid: str) -> Partition:
        part = self._parts.get(pid)
        if part is None:
            known = sorted(self._parts) or "none"
            raise UnknownPartitionError(
                f"partition {pid!r} is not registered (registered: {known}); call "
                f"register_partition({pid!r}, fields, num_samples) first"
            )
        return part

    def partitions(self) -> list[str]:
        return list(self._parts)

    def drop_partition(self, pid: str) -> None:
        part = self.partition(pid)
        self.freed.extend(p for p, _ in part.chunks.values())
        del self._parts[pid]

    # ---- writes

    def _slots(self, part: Partition, ids: Sequence[str]) -> np.ndarray:
        # map over dict.get: no Python frame per key
        return np.fromiter(map(part.slot_of.get, ids, itertools.repeat(-1)), dtype=np.int64, count=len(ids))

    def seq_lens(self, pid: str, ids: Sequence[str]) -> list[int | None]:
        """Stored sequence length of each key (None for keys not yet stored or without one)."""
        part = self.partition(pid)
        slots = self._slots(part, ids)
        return _lens_out(np.where(slots >= 0, part.seq_len[np.maximum(slots, 0)], -1))

    def commit(self, pid: str, ids: Sequence[str], payloads: dict[str, Any], spec: WriteSpec) -> Committed:
        """Record rows 0..n-1 of payloads[field] as field of ids[0..n-1], after checking `spec` against the store."""
        part = self.partition(pid)
        n = len(ids)
        if part.cleared and not part.cleared.keys().isdisjoint(ids):
            cleared = [s for s in ids if s in part.cleared]
            field = next(iter(payloads), "?")
            raise ClearedKeyError(
                f"partition {pid!r}: keys {fmt_keys(cleared)} were cleared; writing field {field!r} "
                "to a cleared key is refused (mint new keys for new samples)"
            )
        token_lens, seq_lens, tags = spec.token_lens, spec.seq_lens, spec.tags
        unknown_fields = [f for f in payloads if f not in part.fields]
        if unknown_fields:
            raise MissingFieldError(
                f"partition {pid!r}: fields {unknown_fields} are not registered (registered: "
                f"{part.fields}); add them to register_partition(fields=...) (keys {fmt_keys(ids)})"
            )
        slots = self._slots(part, ids)
        known = slots >= 0
        stored = np.where(known, part.seq_len[np.maximum(slots, 0)], -1)
        final = stored.copy()
        if seq_lens is not None:
            new = np.asarray(seq_lens, dtype=np.int64)
            if spec.seq_lens_explicit:
                bad = np.nonzero((stored >= 0) & (new != stored))[0]
                if len(bad):
                    i = int(bad[0])
                    raise ShapeError(
                        f"partition {pid!r}: keys {fmt_keys([ids[j] for j in bad])} already have sequence "
                        f"length {int(stored[i])} (key {ids[i]!r}); this "
                        f"put says {int(new[i])}: lengths cannot change"
                    )
            final = np.where(stored >= 0, stored, new)
        for field, lens in token_lens.items():
            lens_arr = np.asarray(lens, dtype=np.int64)
            bad = np.nonzero((final >= 0) & (lens_arr > final))[0]
            if len(bad):
                i = int(bad[0])
                raise ShapeError(
                    f"partition {pid!r}: per-token field {field!r} is longer than the sequence length "
                    f"for keys {fmt_keys([ids[j] for j in bad])} (key "
                    f"{ids[i]!r}: {int(lens_arr[i])} > {int(final[i])})"
                )
        # Validated: apply. New keys get slots (cleared ones first).
        fresh = np.nonzero(~known)[0]
        if len(fresh):
            slots[fresh] = part.take_slots(list(ids) if len(fresh) == n else [ids[i] for i in fresh.tolist()])
        rows = np.arange(n, dtype=np.int64)
        chunks = {}
        for field, payload in payloads.items():
            arr = part.field_loc(field)
            self._release(part, arr[0, slots])
            cid = chunks[field] = next(self._chunk_ids)
            part.chunks[cid] = [payload, n]
            arr[0, slots] = cid
            arr[1, slots] = rows
        part.seq_len[slots] = final
        if tags is not None:
            for slot, t in zip(slots.tolist(), tags):
                if t:
                    part.tags[slot] = {**(part.tags[slot] or {}), **t}
        out_tags = [part.tags[s] or {} for s in slots.tolist()]
        return Committed(_lens_out(final), out_tags if any(out_tags) else None, part.task_name, chunks)

    def attach(self, pid: str, chunks: dict[str, int], payloads: dict[str, Any]) -> None:
        """Put `payloads[field]` in place of chunk `chunks[field]`'s PENDING payload (dropped if already released)."""
        part = self._parts.get(pid)
        for field, cid in chunks.items():
            entry = None if part is None else part.chunks.get(cid)
            if entry is None:
                self.freed.append(payloads[field])
            else:
                entry[0] = payloads[field]

    def _release(self, part: Partition, cids: np.ndarray) -> None:
        cids = cids[cids >= 0]
        if not len(cids):
            return
        for cid, count in zip(*(a.tolist() for a in np.unique(cids, return_counts=True))):
            entry = part.chunks[cid]
            entry[1] -= count
            if entry[1] == 0:
                self.freed.append(part.chunks.pop(cid)[0])  # last reference: the payload can go

    # ---- reads

    def _live_slots(self, pid: str, ids: Sequence[str], what: str) -> tuple[Partition, np.ndarray]:
        part = self.partition(pid)
        slots = self._slots(part, ids)
        if (slots < 0).any():
            absent = [s for s, slot in zip(ids, slots.tolist()) if slot < 0]
            cleared = [s for s in absent if s in part.cleared]
            if cleared:
                raise ClearedKeyError(f"partition {pid!r}: keys {fmt_keys(cleared)} were cleared; cannot {what}")
            raise MissingKeyError(
                f"partition {pid!r}: keys {fmt_keys(absent)} are not stored ({len(part.slot_of)} live "
                f"keys in the partition); cannot {what}"
            )
        return part, slots

    def lookup(self, pid: str, ids: Sequence[str], fields: Sequence[str]) -> LookupPlan:
        if not fields:
            raise MissingFieldError(
                f"partition {pid!r}: select_fields is empty; name the fields to fetch (keys {fmt_keys(ids)})"
            )
        part, slots = self._live_slots(pid, ids, f"get fields {list(fields)}")
        parts: dict[str, list] = {}
        for field in fields:
            arr = part.loc.get(field)
            cids = np.full(len(ids), -1, dtype=np.int64) if arr is None else arr[0, slots]
            if (cids < 0).any():
                lacking = [ids[i] for i in np.nonzero(cids < 0)[0].tolist()]
                hint = "" if field in part.fields else f" (registered fields: {part.fields})"
                raise MissingFieldError(
                    f"partition {pid!r}: field {field!r} is not written for keys {fmt_keys(lacking)}{hint}"
                )
            rows = arr[1, slots]  # type: ignore[index]
            uniq = np.unique(cids)
            if len(uniq) == 1:
                parts[field] = [(part.chunks[int(uniq[0])][0], rows.tolist(), list(range(len(ids))))]
                continue
            parts[field] = []
            for cid in uniq.tolist():
                pos = np.nonzero(cids == cid)[0]
                parts[field].append((part.chunks[cid][0], rows[pos].tolist(), pos.tolist()))
        return LookupPlan(parts)

    def verify(self, pid: str, ids: Sequence[str], expected: dict[str, np.ndarray]) -> bool:
        """True if every key's fields are still in chunks `expected[field][i]`; False if overwritten since.

        Cleared or unknown keys raise as in `lookup`."""
        part, slots = self._live_slots(pid, ids, f"get fields {list(expected)}")
        for field, cids in expected.items():
            arr = part.loc.get(field)
            if arr is None or not np.array_equal(arr[0, slots], cids):
                return False
        return True

    def locate(self, pid: str, ids: Sequence[str]) -> tuple[dict[str, tuple[list, np.ndarray, np.ndarray]],
                                                             DataPlaneError | None]:
        """Where every written field of `ids` is now, for a reader that cannot ask later.

        field -> (payloads, (n,) payload index or -1, (n,) row), and the error a read of non-live keys would raise."""
        part = self._parts.get(pid)
        if part is None:
            try:
                self.partition(pid)
            except DataPlaneError as err:
                return {}, err
        assert part is not None
        slots = self._slots(part, ids)
        live = slots >= 0
        err = None
        if not live.all():
            try:
                self._live_slots(pid, ids, "read them")
            except DataPlaneError as e:
                err = e
        safe = np.maximum(slots, 0)
        where = {}
        for field, arr in part.loc.items():
            cids = np.where(live, arr[0, safe], -1)
            uniq, which = np.unique(cids, return_inverse=True)
            if uniq[-1] < 0:
                continue  # not written for any of these keys
            first = 1 if uniq[0] < 0 else 0  # -1 sorts first: "not written" takes no payload
            payloads = [part.chunks[int(c)][0] for c in uniq[first:]]
            where[field] = (payloads, which.astype(np.int64) - first, np.where(cids >= 0, arr[1, safe], -1))
        return where, err

    def list(self, pid: str) -> list[str]:
        return list(self.partition(pid).slot_of)

    def describe(self, pid: str, ids: Sequence[str] | None) -> tuple[list[str], list[str], list[int | None], list[dict],
                                                                     str | None]:
        """(ids, fields written for all of them, seq_lens, tags, task_name) to rebuild a meta."""
        part = self.partition(pid)
        ids = list(part.slot_of) if ids is None else list(ids)
        _, slots = self._live_slots(pid, ids, "describe them")
        fields = [f for f in part.fields if f in part.loc and (part.loc[f][0, slots] >= 0).all()]
        tags = [part.tags[s] or {} for s in slots.tolist()]
        return ids, fields, _lens_out(part.seq_len[slots]), tags, part.task_name

    def status(self, pid: str, ids: Sequence[str] | None, fields: Sequence[str] | None) -> dict[str, dict[str, bool]]:
        """{key: {field: written?}}; keys not (yet) stored report False for every field."""
        part = self.partition(pid)
        ids = list(part.slot_of) if ids is None else list(ids)
        fields = list(part.fields) if fields is None else list(fields)
        slots = self._slots(part, ids)
        have = {}
        for f in fields:
            arr = part.loc.get(f)
            have[f] = np.zeros(len(ids), bool) if arr is None else (slots >= 0) & (arr[0, np.maximum(slots, 0)] >= 0)
        return {s: {f: bool(have[f][i]) for f in fields} for i, s in enumerate(ids)}

    def ready(self, pid: str, fields: Sequence[str]) -> list[str]:
        """Live keys that have every one of `fields` written."""
        part = self.partition(pid)
        ids = list(part.slot_of)
        slots = self._slots(part, ids)
        ok = np.ones(len(ids), bool)
        for f in fields:
            arr = part.loc.get(f)
            ok &= False if arr is None else arr[0, slots] >= 0
        return [s for s, k in zip(ids, ok.tolist()) if k]

    def expected(self, pid: str) -> int:
        return self.partition(pid).num_samples

    # ---- clears

    def clear(self, pid: str, ids: Iterable[str] | None) -> int:
        """Forget `ids` (all live keys if None); returns how many were cleared."""
        part = self.partition(pid)
        ids = list(part.slot_of) if ids is None else list(dict.fromkeys(ids))
        _, slots = self._live_slots(pid, ids, "clear them")
        if len(ids) == len(part.slot_of):  # every live key (a step's final clear): no per-key release
            self.freed.extend(payload for payload, _ in part.chunks.values())
            part.chunks.clear()
            for arr in part.loc.values():
                arr[:, : part.num_slots] = -1
            part.seq_len[: part.num_slots] = -1
            part.tags = [None] * len(part.tags)
            part.cleared.update(part.slot_of)
            part.free.extend(part.slot_of.values())
            part.slot_of.clear()
            return len(ids)
        for arr in part.loc.values():
            self._release(part, arr[0, slots])
            arr[:, slots] = -1
        part.seq_len[slots] = -1
        slot_list = slots.tolist()
        for s, slot in zip(ids, slot_list):
            del part.slot_of[s]
            part.tags[slot] = None
        part.cleared.update(zip(ids, slot_list))
        part.free.extend(slot_list)
        return len(ids)

    def num_chunks(self, pid: str | None = None) -> int:
        pids = self._parts if pid is None else [pid]
        return sum(len(self._parts[p].chunks) for p in pids)

    def footprint(self, pid: str) -> dict[str, int]:
        """The partition's size (`Partition.footprint`): what stays O(live keys) over any number of steps."""
        return self.partition(pid).footprint()


# The `PlaneIndex` methods a client in another process may ask for (a store actor's, a forwarding server's), by
# the name that crosses to it: a caller names the method itself (`PlaneIndex.lookup`), the name is used here only.
REMOTE_METHODS = {m.__name__: m for m in (
    PlaneIndex.register, PlaneIndex.seq_lens, PlaneIndex.commit, PlaneIndex.lookup, PlaneIndex.verify, PlaneIndex.list,
    PlaneIndex.describe, PlaneIndex.status, PlaneIndex.ready, PlaneIndex.expected, PlaneIndex.clear,
    PlaneIndex.num_chunks, PlaneIndex.footprint)}


def remote_method(name: str):
    """The `PlaneIndex` method a remote caller named (:data:`REMOTE_METHODS`); any other name is refused."""
    if name not in REMOTE_METHODS:
        raise DataPlaneError(f"data-plane index call {name!r} is not one a remote client may make")
    return REMOTE_METHODS[name]
