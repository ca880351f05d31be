"""`IndexedClient`: `DataPlaneClient` implemented once over the backend hooks (`_commit`, `_fetch`, `_index_call`).

Encoding and decoding run in the caller's process, so bulk data never passes the index's owner. A sample's
length is fixed by its first per-token write: `seq_lens=`, else the meta's, else `input_lengths`, else the
`seq_len_field` rows, else the longest row; later writes must fit, and padded (B, T) fields are trimmed to it.
"""

from __future__ import annotations

import abc
import functools
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .codec import Column, gather_dense, gather_jagged, jagged_from_padded, pack_rows
from .columns import INPUT_IDS, pad_values as declared_pads
from .errors import DataPlaneError, DuplicateKeyError, ShapeError, fmt_keys
from .index import Committed, LookupPlan, PlaneIndex, WriteSpec
from .interface import DEFAULT_TOKEN_FIELDS, DataPlaneClient, FieldValue, SampleIds
from .meta import GLOBAL_PAD_KEY, KVBatchMeta

__all__ = ["IndexedClient", "check_register", "encoded", "resolve"]

_DTYPE = operator.attrgetter("dtype")


def resolve(
    sample_ids: SampleIds | None, partition_id: str | None
) -> tuple[list[str] | None, str, KVBatchMeta | None]:
    """(keys, partition, meta) from a meta or a key list; a meta's partition must agree if both given."""
    if isinstance(sample_ids, KVBatchMeta):
        meta = sample_ids
        if partition_id is not None and partition_id != meta.partition_id:
            raise DataPlaneError(
                f"partition {partition_id!r} given with a meta of partition {meta.partition_id!r}; "
                "pass partition_id=None or the meta's own partition"
            )
        return list(meta.sample_ids), meta.partition_id, meta
    if partition_id is None:
        raise DataPlaneError("partition_id is required when sample_ids is a list of keys, not a KVBatchMeta")
    if isinstance(sample_ids, str):
        raise DataPlaneError(
            f"partition {partition_id!r}: sample_ids is the string {sample_ids!r}; pass a list of keys"
        )
    return (None if sample_ids is None else [str(s) for s in sample_ids]), partition_id, None


def encoded(columns: Mapping[str, Column | Callable[[], Column]]) -> dict[str, Column]:
    """`columns` with the encodings `put_samples` deferred (callables) done."""
    return {name: col() if callable(col) else col for name, col in columns.items()}


def _shard_layout(pid: str, shards: Sequence[Sequence[int]], n: int) -> tuple[list[int], list[int]]:
    """(the rows in shard order, the row where each non-empty shard starts in it, then n)."""
    try:
        parts = [[int(i) for i in rows] for rows in shards]
    except (TypeError, ValueError):
        raise DataPlaneError(f"partition {pid!r}: shards= must be a list of lists of row indices") from None
    order = [i for rows in parts for i in rows]
    if sorted(order) != list(range(n)):
        raise DataPlaneError(
            f"partition {pid!r}: shards= lists {len(order)} row indices for {n} keys; each row 0..{n - 1} "
            "must appear in exactly one shard (use dp_shard_rows(seq_lens, dp_world))"
        )
    bounds = [0]
    for rows in parts:
        if rows:
            bounds.append(bounds[-1] + len(rows))
    return order, bounds


def _rows_at(value: Any, order: list[int]) -> Any:
    """A field's rows in `order` (a value of the wrong size goes as is: put_samples names the error)."""
    if isinstance(value, torch.Tensor):
        return value[torch.as_tensor(order)] if value.dim() and len(value) == len(order) else value
    rows = list(value)
    return [rows[i] for i in order] if len(rows) == len(order) else rows


def _pack_rows(pid: str, ids: list[str], name: str, value: Sequence[Any]) -> Column:
    """A field given as a list of rows, packed into one jagged column."""
    rows = list(value)
    if len(rows) != len(ids):
        raise ShapeError(f"partition {pid!r}: field {name!r} has {len(rows)} rows for {len(ids)} keys {fmt_keys(ids)}")
    if set(map(type, rows)) != {torch.Tensor}:  # (a C-level pass; the usual case)
        rows = [r if isinstance(r, torch.Tensor) else torch.as_tensor(r) for r in rows]
    # One dtype (cat would silently promote); only a failed put pays for listing the shapes.
    try:
        if len(set(map(_DTYPE, rows))) > 1:
            raise TypeError
        return pack_rows(rows)
    except (RuntimeError, TypeError):
        kinds = {(f"{r.dim()}-D", tuple(r.shape[1:]), r.dtype) for r in rows}
        raise ShapeError(
            f"partition {pid!r}: field {name!r} rows disagree in rank, trailing shape or dtype "
            f"{sorted(map(str, kinds))} (keys {fmt_keys(ids)}); rows must differ only in length"
        ) from None


def check_register(partition_id: str, fields: Sequence[str], num_samples: int) -> tuple[str, list[str], int]:
    if isinstance(fields, str):
        raise DataPlaneError(f"partition {partition_id!r}: fields is the string {fields!r}; pass a list of names")
    fields = list(dict.fromkeys(fields))
    if not fields:
        raise DataPlaneError(f"partition {partition_id!r}: register_partition needs at least one field name")
    if int(num_samples) < 0:
        raise DataPlaneError(f"partition {partition_id!r}: num_samples = {num_samples}; it must be >= 0")
    return str(partition_id), fields, int(num_samples)


class IndexedClient(DataPlaneClient):
    """The shared implementation: encode/validate here, index calls and storage in the backend."""

    def __init__(self, token_fields: Iterable[str] = DEFAULT_TOKEN_FIELDS, seq_len_field: str = INPUT_IDS) -> None:
        self.token_fields = frozenset(token_fields)
        self.seq_len_field = seq_len_field
        self._closed = False

    # ---- backend hooks

    @abc.abstractmethod
    def _index_call(self, method: Callable, *args: Any) -> Any:
        """Call ``method`` (a `PlaneIndex` method, e.g. ``PlaneIndex.lookup``) with ``args`` on the index wherever it
        lives; re-raise its errors as is."""

    @abc.abstractmethod
    def _commit(self, pid: str, ids: list[str], columns: dict[str, Column | Callable[[], Column]], spec: WriteSpec,
                bounds: list[int] | None) -> tuple[Committed, tuple]:
        """Store `columns` (some deferred: `encoded`) and record them; returns the index's answer and the receipt's
        locations. `bounds`: where each part starts, then n (None: one part)."""

    @abc.abstractmethod
    def _fetch(self, plan: LookupPlan) -> dict[str, list[tuple[Column, list[int], list[int]]]]:
        """Turn the plan's payloads back into columns (same structure as plan.parts)."""

    #: Whether `_commit` stores a put's shards apart (else they are only checked).
    _splits_puts = False

    def _lookup(self, pid: str, ids: list[str], fields: list[str]) -> LookupPlan:
        return self._index_call(PlaneIndex.lookup, pid, ids, fields)

    def _check_open(self) -> None:
        if self._closed:
            raise DataPlaneError(f"{type(self).__name__} is closed")

    # ---- interface

    def register_partition(self, partition_id, fields, num_samples, *, task_name=None):
        self._check_open()
        self._index_call(PlaneIndex.register, *check_register(partition_id, fields, num_samples), task_name)

    def put_samples(self, sample_ids, partition_id, fields, tags=None, *, seq_lens=None, shards=None):
        """Check, pack, settle sequence lengths, trim padded per-token fields, commit, build the receipt."""
        self._check_open()
        ids, pid, meta = resolve(sample_ids, partition_id)
        assert ids is not None
        bounds = None
        if shards is not None:
            order, bounds = _shard_layout(pid, shards, len(ids))
            if not self._splits_puts:
                bounds = None
            elif order != list(range(len(ids))):
                return self._put_in_shard_order(ids, pid, meta, fields, tags, seq_lens, order, bounds)
        tags = self._check_put(pid, ids, fields, tags)
        lens = self._stated_lens(pid, ids, meta, fields, seq_lens)
        columns, token_lens, padded = self._pack(pid, ids, fields)
        derived = lens is None and bool(token_lens)
        if derived:
            src = token_lens.get(self.seq_len_field)
            lens = src if src is not None else np.max(np.stack(list(token_lens.values())), axis=0)
        if padded:
            known = lens if lens is not None and not derived else self._stored_lens(pid, ids, lens, padded[0])
            for name in padded:
                columns[name], token_lens[name] = self._trimmed(fields[name], known)
        committed, located = self._commit(pid, ids, columns, WriteSpec(token_lens, lens, not derived, tags), bounds)
        return self._receipt(pid, ids, meta, fields, committed, located)

    def _put_in_shard_order(self, ids, pid, meta, fields, tags, seq_lens, order, bounds) -> KVBatchMeta:
        """A put whose shards are not contiguous: stored in shard order, receipt in the caller's order."""
        n = len(ids)
        inverse = np.empty(n, dtype=np.int64)
        inverse[order] = np.arange(n)
        explicit = None if seq_lens is None else torch.as_tensor(seq_lens).reshape(-1)
        receipt = self.put_samples(
            [ids[i] for i in order] if meta is None else meta.subset(order), pid,
            {name: _rows_at(value, order) for name, value in fields.items()},
            None if tags is None else _rows_at(tags, order),
            seq_lens=None if explicit is None else _rows_at(explicit, order),
            shards=[range(a, b) for a, b in zip(bounds, bounds[1:])],
        )
        return receipt.subset(inverse.tolist())

    @staticmethod
    def _check_put(pid: str, ids: list[str], fields: Mapping[str, FieldValue],
                   tags: Sequence[Mapping[str, Any]] | None) -> list[dict] | None:
        """Refuse a put with no fields or repeated keys; the tags as dicts, one per key."""
        n = len(ids)
        if not fields:
            raise DataPlaneError(f"partition {pid!r}: put_samples with no fields (keys {fmt_keys(ids)})")
        if len(set(ids)) != n:
            seen: set[str] = set()
            dups = [s for s in ids if s in seen or seen.add(s)]
            raise DuplicateKeyError(
                f"partition {pid!r}: keys {fmt_keys(dups)} appear more than once in one put "
                f"(fields {list(fields)}); each key names one sample"
            )
        if tags is None:
            return None
        tags = [dict(t) for t in tags]
        if len(tags) != n:
            raise DataPlaneError(
                f"partition {pid!r}: {len(tags)} tags for {n} keys {fmt_keys(ids)} (fields "
                f"{list(fields)}); give exactly one dict per key"
            )
        return tags

    @staticmethod
    def _stated_lens(pid, ids, meta, fields, seq_lens) -> list[int] | None:
        """The sequence lengths the put states: `seq_lens=`, else the meta's, else an `input_lengths` field."""
        explicit = seq_lens if seq_lens is not None else (meta.seq_lens if meta is not None else None)
        if explicit is None and "input_lengths" in fields and isinstance(fields["input_lengths"], torch.Tensor):
            explicit = fields["input_lengths"]
        lens = None if explicit is None else [int(x) for x in torch.as_tensor(explicit).reshape(-1).tolist()]
        if lens is not None and len(lens) != len(ids):
            raise ShapeError(f"partition {pid!r}: {len(lens)} sequence lengths for {len(ids)} keys {fmt_keys(ids)}")
        return lens

    def _pack(self, pid: str, ids: list[str], fields: Mapping[str, FieldValue]
              ) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
        """(packed columns, per-token field -> (n,) int64 row lengths, padded per-token fields to pack once trimmed)."""
        n = len(ids)
        columns: dict[str, Any] = {}
        token_lens: dict[str, Any] = {}
        padded = []
        for name, value in fields.items():
            if isinstance(value, torch.Tensor):
                if value.dim() == 0 or value.shape[0] != n:
                    got = "a 0-d tensor" if value.dim() == 0 else f"first dimension {value.shape[0]}"
                    raise ShapeError(
                        f"partition {pid!r}: field {name!r} has {got} for {n} keys {fmt_keys(ids)}; "
                        "the first dimension must be the number of keys"
                    )
                if name in self.token_fields and value.dim() >= 2:
                    padded.append(name)
                else:
                    columns[name] = Column(value.detach().cpu().contiguous())
                continue
            col = _pack_rows(pid, ids, name, value)
            columns[name] = col
            if name in self.token_fields:
                token_lens[name] = col.row_lengths().numpy()
        return columns, token_lens, padded

    def _stored_lens(self, pid: str, ids: list[str], lens: Any, field: str) -> list[int]:
        """Each key's sequence length for trimming: the stored one, else this put's; raises for neither."""
        stored = self._index_call(PlaneIndex.seq_lens, pid, ids)
        known = [s if s is not None else (lens[i] if lens is not None else None) for i, s in enumerate(stored)]
        if any(k is None for k in known):
            unknown = [s for s, k in zip(ids, known) if k is None]
            raise ShapeError(
                f"partition {pid!r}: per-token field {field!r} is padded but keys "
                f"{fmt_keys(unknown)} have no sequence length yet; pass seq_lens= or write "
                f"{self.seq_len_field!r} as a list of 1-D tensors first"
            )
        return known

    @staticmethod
    def _trimmed(value: torch.Tensor, lens: Any) -> tuple[Callable[[], Column], np.ndarray]:
        """(the padded (B, T, ...) field's jagged column, to encode later, its row lengths)."""
        value = value.detach().cpu()
        trimmed = np.minimum(np.asarray(lens, dtype=np.int64), value.shape[1])  # the jagged rows' lengths
        # Encoded in the backend's _commit (ray: while the store checks); cannot fail, so the commit goes first.
        return functools.partial(jagged_from_padded, value, torch.from_numpy(trimmed)), trimmed

    @staticmethod
    def _receipt(pid, ids, meta, fields, committed: Committed, located: tuple) -> KVBatchMeta:
        """The put's receipt from checked values (no per-row re-normalising); tags from the index."""
        out_lens = None if any(x is None for x in committed.seq_lens) else tuple(committed.seq_lens)
        if committed.tags is None:  # no key carries tags: the store spares sending n empty dicts
            final_tags = [{} for _ in ids]
        else:
            final_tags = [dict(t) for t in committed.tags]
        if meta is None:
            return KVBatchMeta.trusted(pid, committed.task_name, tuple(ids), tuple(fields), out_lens,
                                       tuple(final_tags), {}, tuple(located))
        return KVBatchMeta.trusted(
            pid,
            meta.task_name if meta.task_name is not None else committed.task_name,
            tuple(ids),
            tuple(dict.fromkeys([*meta.fields, *fields])),
            out_lens if out_lens is not None else meta.seq_lens,
            tuple({**old, **new} for old, new in zip(meta.tags, final_tags)),
            dict(meta.extra_info),
            (*meta.locations, *located),  # later locations win for a key both hold
        )

    def get_samples(self, sample_ids, partition_id, select_fields, pad_values=None, pad_to=None):
        self._check_open()
        ids, pid, meta = resolve(sample_ids, partition_id)
        assert ids is not None
        if isinstance(select_fields, str):
            select_fields = [select_fields]
        select_fields = list(select_fields or [])
        parts = self._fetch(self._lookup(pid, ids, select_fields))
        return self._assemble(pid, ids, meta, select_fields, parts, pad_values, pad_to)

    def _assemble(self, pid, ids, meta, select_fields, parts, pad_values, pad_to) -> dict[str, torch.Tensor]:
        """`get_samples`' answer from the fetched chunks: fresh padded (or dense) tensors in `ids` order."""
        pad_values = {**declared_pads(select_fields), **(pad_values or {})}
        if pad_to is None and meta is not None:
            pad_to = meta.extra_info.get(GLOBAL_PAD_KEY)
        n = len(ids)
        out: dict[str, torch.Tensor] = {}
        token_cols = [f for f in select_fields if f in self.token_fields and parts[f] and parts[f][0][0].jagged]
        token_len = 0
        for f in token_cols:
            for col, rows, _ in parts[f]:
                if rows:
                    token_len = max(token_len, int(col.row_lengths()[torch.as_tensor(rows)].max()))
        if pad_to is not None:
            if token_len > pad_to:
                raise ShapeError(
                    f"partition {pid!r}: pad_to={pad_to} is shorter than the longest per-token row "
                    f"({token_len}) of fields {token_cols} (keys {fmt_keys(ids)}); raise pad_to"
                )
            token_len = int(pad_to)
        for field in select_fields:
            field_parts = parts[field]
            if n == 0:
                out[field] = torch.zeros(0)
                continue
            kinds = {col.jagged for col, _, _ in field_parts}
            if len(kinds) > 1:
                raise ShapeError(
                    f"partition {pid!r}: field {field!r} was written jagged for some keys and dense for "
                    f"others (keys {fmt_keys(ids)}); write it one way"
                )
            if kinds.pop():
                if field in token_cols:
                    length = token_len
                else:
                    length = max(int(c.row_lengths()[torch.as_tensor(r)].max()) for c, r, _ in field_parts)
                out[field] = gather_jagged(field_parts, n, length, pad_values.get(field, 0))
            else:
                shapes = {tuple(c.values.shape[1:]) for c, _, _ in field_parts}
                if len(shapes) > 1:
                    raise ShapeError(
                        f"partition {pid!r}: field {field!r} has rows of different shapes {sorted(shapes)} "
                        f"across puts (keys {fmt_keys(ids)}); write it as a list of tensors (jagged)"
                    )
                out[field] = gather_dense(field_parts, n)
        return out

    def clear_samples(self, sample_ids, partition_id, *, wait=True):
        self._check_open()
        ids, pid, _ = resolve(sample_ids, partition_id)
        return self._index_call(PlaneIndex.clear, pid, ids)

    def list_samples(self, partition_id):
        self._check_open()
        return self._index_call(PlaneIndex.list, partition_id)

    def meta_for(self, partition_id, sample_ids=None):
        self._check_open()
        ids, fields, lens, tags, task = self._index_call(
            PlaneIndex.describe, partition_id, None if sample_ids is None else list(sample_ids))
        out_lens = None if any(x is None for x in lens) else tuple(lens)
        return KVBatchMeta(partition_id, task, tuple(ids), tuple(fields), out_lens, tuple(tags))

    def status(self, partition_id, sample_ids=None, fields=None):
        self._check_open()
        return self._index_call(PlaneIndex.status, partition_id, None if sample_ids is None else list(sample_ids),
                                None if fields is None else list(fields))

    def ready_samples(self, partition_id, fields):
        self._check_open()
        return self._index_call(PlaneIndex.ready, partition_id, list(fields))

    def is_complete(self, partition_id, fields):
        self._check_open()
        return len(self.ready_samples(partition_id, fields)) >= self._index_call(PlaneIndex.expected, partition_id)

    def footprint(self, partition_id):
        self._check_open()
        return self._index_call(PlaneIndex.footprint, partition_id)
