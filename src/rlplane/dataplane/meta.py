"""`KVBatchMeta`: the receipt for a batch of samples in the data plane; every operation is pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from .errors import DataPlaneError, DuplicateKeyError, MissingKeyError, fmt_keys

__all__ = ["GLOBAL_PAD_KEY", "PAD_MULTIPLE_KEY", "KVBatchMeta", "concat_metas"]

# extra_info keys with a meaning the plane itself understands (NeMo RL's names).
GLOBAL_PAD_KEY = "global_forward_pad_seqlen"  # every DP rank pads per-token fields to this length
PAD_MULTIPLE_KEY = "pad_to_multiple"  # round the global pad length up to a multiple of this


def _plain(value: Any) -> Any:
    """A tag value as a plain Python scalar (tensor/numpy element -> int/float/bool)."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return value.item()
    return value


@dataclasses.dataclass(frozen=True)
class KVBatchMeta:
    """Receipt for `len(sample_ids)` samples stored under `partition_id`.

    Attributes:
        partition_id: namespace of the keys (one per step and stage).
        task_name: producer or consumer of the batch (free text).
        sample_ids: the unique keys, one per row.
        fields: fields written for every row (what `get_samples` may ask).
        seq_lens: unpadded per-row sequence length, or None when no per-token field was written.
        tags: per-row dicts of small scalars (rewards, baselines: filter without fetch).
        extra_info: batch-level values, e.g. `global_forward_pad_seqlen`.
        locations: the backend's hint of where the rows live (ray: put receipts), checked against the
            index on read; kept by subset and concat, not compared, not shown.
    """

    partition_id: str
    task_name: str | None
    sample_ids: tuple[str, ...]
    fields: tuple[str, ...] = ()
    seq_lens: tuple[int, ...] | None = None
    tags: tuple[dict, ...] | None = None
    extra_info: dict = dataclasses.field(default_factory=dict)
    locations: tuple = dataclasses.field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        # Tuples: a meta cannot be appended to in place.
        ids = tuple(str(s) for s in self.sample_ids)
        object.__setattr__(self, "sample_ids", ids)
        object.__setattr__(self, "fields", tuple(self.fields))
        n = len(ids)
        if len(set(ids)) != n:
            seen: set[str] = set()
            dups = [s for s in ids if s in seen or seen.add(s)]
            raise DuplicateKeyError(
                f"partition {self.partition_id!r}: KVBatchMeta has duplicate keys {fmt_keys(dups)}; "
                "every row must name a distinct sample"
            )
        if self.seq_lens is not None:
            lens = tuple(int(x) for x in self.seq_lens)
            if len(lens) != n:
                raise DataPlaneError(
                    f"partition {self.partition_id!r}: seq_lens has {len(lens)} entries for {n} keys; "
                    "give one length per sample id"
                )
            object.__setattr__(self, "seq_lens", lens)
        tags = tuple({} for _ in ids) if self.tags is None else tuple(dict(t) for t in self.tags)
        if len(tags) != n:
            raise DataPlaneError(
                f"partition {self.partition_id!r}: {len(tags)} tags for {n} keys; tags are per row, "
                "give exactly one dict per sample id"
            )
        object.__setattr__(self, "tags", tags)
        object.__setattr__(self, "extra_info", dict(self.extra_info))
        object.__setattr__(self, "locations", tuple(self.locations))

    def __len__(self) -> int:
        return len(self.sample_ids)

    def __reduce__(self):
        # Values as they are (checked when made): no re-normalising of every row on arrival.
        return _rebuilt, tuple(getattr(self, f) for f in _FIELD_NAMES)

    @classmethod
    def trusted(cls, *values: Any) -> KVBatchMeta:
        """A meta from already-normalised values in field order (a client's receipt): no per-row pass."""
        return _rebuilt(*values)

    def _derive(self, **changes: Any) -> KVBatchMeta:
        """`dataclasses.replace` without re-normalising rows; only new row sets are checked for repeated keys."""
        out = object.__new__(KVBatchMeta)
        for f in _FIELD_NAMES:
            object.__setattr__(out, f, changes[f] if f in changes else getattr(self, f))
        if "sample_ids" in changes and len(set(out.sample_ids)) != len(out.sample_ids):
            seen: set[str] = set()
            dups = [s for s in out.sample_ids if s in seen or seen.add(s)]
            raise DuplicateKeyError(
                f"partition {self.partition_id!r}: KVBatchMeta has duplicate keys {fmt_keys(dups)}; "
                "every row must name a distinct sample"
            )
        return out

    # ---- row selection

    def subset(self, indices: Sequence[int] | torch.Tensor) -> KVBatchMeta:
        """Rows at `indices` (ints, in the order given, or a boolean mask of length len(self))."""
        if isinstance(indices, torch.Tensor):
            if indices.dtype == torch.bool:
                if indices.numel() != len(self):
                    raise DataPlaneError(
                        f"partition {self.partition_id!r}: boolean mask of length {indices.numel()} "
                        f"for a meta of {len(self)} rows"
                    )
                indices = indices.nonzero().flatten()
            indices = indices.tolist()
        idx = [int(i) for i in indices]
        n = len(self)
        bad = [i for i in idx if not -n <= i < n]
        if bad:
            raise DataPlaneError(
                f"partition {self.partition_id!r}: row indices {bad[:5]} out of range for {n} rows"
            )
        return self._derive(
            sample_ids=tuple([self.sample_ids[i] for i in idx]),
            seq_lens=None if self.seq_lens is None else tuple([self.seq_lens[i] for i in idx]),
            tags=tuple([self.tags[i] for i in idx]),
        )

    def slice(self, start: int, stop: int | None = None) -> KVBatchMeta:
        """Rows `start:stop` (Python slice semantics)."""
        return self.subset(range(len(self))[start:stop])

    def drop(self, sample_ids: Iterable[str]) -> KVBatchMeta:
        """This meta without `sample_ids` (which must all be in it); may come back empty."""
        gone = set(sample_ids)
        unknown = gone.difference(self.sample_ids)
        if unknown:
            raise MissingKeyError(
                f"partition {self.partition_id!r}: cannot drop keys {fmt_keys(sorted(unknown))}: "
                "they are not in this meta"
            )
        return self.subset([i for i, s in enumerate(self.sample_ids) if s not in gone])

    def select_ids(self, sample_ids: Sequence[str]) -> KVBatchMeta:
        """Rows for `sample_ids`, in that order (each must be in this meta)."""
        pos = {s: i for i, s in enumerate(self.sample_ids)}
        missing = [s for s in sample_ids if s not in pos]
        if missing:
            raise MissingKeyError(
                f"partition {self.partition_id!r}: keys {fmt_keys(missing)} are not in this meta"
            )
        return self.subset([pos[s] for s in sample_ids])

    # ---- columns and annotations

    def with_fields(self, fields: Iterable[str]) -> KVBatchMeta:
        """The same rows, promising `fields` instead (narrow before a fetch, widen after a write)."""
        return self._derive(fields=tuple(dict.fromkeys(fields)))

    def stamp_tags(
        self, tags: Mapping[str, Sequence | torch.Tensor] | Sequence[Mapping[str, Any]]
    ) -> KVBatchMeta:
        """New meta with per-row tags merged in: {name: value per row (list or (B,) tensor)} or one dict per row."""
        n = len(self)
        if isinstance(tags, Mapping):
            rows: list[dict] = [{} for _ in range(n)]
            for name, values in tags.items():
                if isinstance(values, torch.Tensor):
                    values = values.reshape(len(values), -1).squeeze(-1) if values.dim() else values
                    values = values.tolist()
                values = list(values)
                if len(values) != n:
                    raise DataPlaneError(
                        f"partition {self.partition_id!r}: tag {name!r} has {len(values)} values for "
                        f"{n} rows; give one value per sample id"
                    )
                for row, v in zip(rows, values):
                    row[name] = _plain(v)
        else:
            rows = [dict(t) for t in tags]
            if len(rows) != n:
                raise DataPlaneError(
                    f"partition {self.partition_id!r}: {len(rows)} tag dicts for {n} rows; give one "
                    "dict per sample id"
                )
        merged = tuple({**old, **new} for old, new in zip(self.tags, rows))
        return self._derive(tags=merged)

    def tag_values(self, name: str) -> list:
        """The tag `name` of every row (KeyError-style DataPlaneError if a row lacks it)."""
        missing = [s for s, t in zip(self.sample_ids, self.tags) if name not in t]
        if missing:
            raise DataPlaneError(
                f"partition {self.partition_id!r}: tag {name!r} missing on keys {fmt_keys(missing)}"
            )
        return [t[name] for t in self.tags]

    def with_locations(self, locations: Iterable[Any]) -> KVBatchMeta:
        """The same rows with the backend's `locations` hints in place of these."""
        return self._derive(locations=tuple(locations))

    def with_extra_info(self, **info: Any) -> KVBatchMeta:
        """New meta with `info` merged into `extra_info`."""
        return self._derive(extra_info={**self.extra_info, **info})

    # ---- combination

    def concat(self, *others: KVBatchMeta) -> KVBatchMeta:
        """This meta followed by `others` (also callable as `KVBatchMeta.concat(a, b, c)`)."""
        return concat_metas([self, *others])


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(KVBatchMeta))
assert _FIELD_NAMES[-1] == "locations"


def _rebuilt(*values: Any) -> KVBatchMeta:
    """A pickled meta (its values were checked when it was made)."""
    out = object.__new__(KVBatchMeta)
    for f, v in zip(_FIELD_NAMES, values):
        object.__setattr__(out, f, v)
    return out


def concat_metas(metas: Sequence[KVBatchMeta]) -> KVBatchMeta:
    """Rows of every meta in order (same partition, no repeated keys).

    Keeps the fields all promise, seq_lens only if all have them, the first's task_name, merged extra_info.
    """
    metas = list(metas)
    if not metas:
        raise DataPlaneError("concat of zero metas: there is no partition to name; pass at least one")
    first = metas[0]
    pids = {m.partition_id for m in metas}
    if len(pids) > 1:
        raise DataPlaneError(f"cannot concat metas of different partitions {sorted(pids)}")
    common = [f for f in first.fields if all(f in m.fields for m in metas[1:])]
    lens = None
    if all(m.seq_lens is not None for m in metas):
        lens = tuple(x for m in metas for x in m.seq_lens)  # type: ignore[union-attr]
    info: dict = {}
    for m in metas:
        info.update(m.extra_info)
    return first._derive(
        sample_ids=tuple(s for m in metas for s in m.sample_ids),
        fields=tuple(common),
        seq_lens=lens,
        tags=tuple(t for m in metas for t in m.tags),
        extra_info=info,
        locations=tuple(dict.fromkeys(loc for m in metas for loc in m.locations)),
    )
