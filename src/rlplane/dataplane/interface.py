"""`DataPlaneClient`: the one interface for bulk per-sample data (NeMo RL's direct-by-key `DataPlaneClient`)."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .columns import TOKEN_COLUMNS
from .meta import KVBatchMeta

__all__ = ["DEFAULT_TOKEN_FIELDS", "DataPlaneClient", "FieldValue", "SampleIds", "replace_metas"]

# Per-token fields: jagged in storage, padded on read; declared in `columns.py`.
DEFAULT_TOKEN_FIELDS = TOKEN_COLUMNS

FieldValue = torch.Tensor | Sequence[torch.Tensor]
SampleIds = Sequence[str] | KVBatchMeta


class DataPlaneClient(abc.ABC):
    """Per-sample columns under string keys, grouped in partitions (one per step and stage)."""

    @abc.abstractmethod
    def register_partition(
        self, partition_id: str, fields: Sequence[str], num_samples: int, *, task_name: str | None = None
    ) -> None:
        """Declare a partition and its fields (re-registering widens them; an empty partition starts afresh).

        `num_samples` is the expected count for `status`/`is_complete`, not a capacity."""

    @abc.abstractmethod
    def put_samples(
        self,
        sample_ids: SampleIds,
        partition_id: str | None,
        fields: Mapping[str, FieldValue],
        tags: Sequence[Mapping[str, Any]] | None = None,
        *,
        seq_lens: Sequence[int] | torch.Tensor | None = None,
        shards: Sequence[Sequence[int]] | None = None,
    ) -> KVBatchMeta:
        """Write `fields` (each (B, ...) or a list of B jagged tensors) for `sample_ids` (keys or a meta).

        Rewriting a field replaces it. `shards`: row indices per reader part (`dp_shard_rows`), stored apart
        so each reader fetches only its own. Returns the receipt (a given meta's fields plus those written)."""

    @abc.abstractmethod
    def get_samples(
        self,
        sample_ids: SampleIds,
        partition_id: str | None,
        select_fields: Sequence[str],
        pad_values: Mapping[str, float | int | bool] | None = None,
        pad_to: int | None = None,
    ) -> dict[str, torch.Tensor]:
        """Fresh tensors for `select_fields`, rows in `sample_ids` order; jagged fields padded (B, T, ...).

        Pad values default to the column's (`columns.py`); per-token fields share one T: `pad_to`, else
        `extra_info["global_forward_pad_seqlen"]`, else the longest row."""

    @abc.abstractmethod
    def clear_samples(self, sample_ids: SampleIds | None, partition_id: str | None, *, wait: bool = True) -> int | None:
        """Forget `sample_ids` (all live keys if None), free their storage, return the count.

        A cleared key raises `ClearedKeyError` until its slot is reused; mint new keys for new samples.
        `wait=False` may return None at once (a refused clear raises on the next call)."""

    @abc.abstractmethod
    def list_samples(self, partition_id: str) -> list[str]:
        """Live keys of the partition, in first-write order."""

    @abc.abstractmethod
    def meta_for(self, partition_id: str, sample_ids: Sequence[str] | None = None) -> KVBatchMeta:
        """A receipt rebuilt from the index: fields written for all `sample_ids` (default: live keys), lengths, tags."""

    @abc.abstractmethod
    def status(
        self, partition_id: str, sample_ids: Sequence[str] | None = None, fields: Sequence[str] | None = None
    ) -> dict[str, dict[str, bool]]:
        """Production status {key: {field: written?}} (default: live keys x registered fields)."""

    @abc.abstractmethod
    def ready_samples(self, partition_id: str, fields: Sequence[str]) -> list[str]:
        """Live keys whose every field in `fields` is written (what a consumer may fetch now)."""

    @abc.abstractmethod
    def is_complete(self, partition_id: str, fields: Sequence[str]) -> bool:
        """True once at least `num_samples` (as registered) keys have every one of `fields`."""

    def prefetch(self, meta: KVBatchMeta) -> None:
        """Hint that a `get_samples` of `meta` follows: start moving its data here and return at once."""

    # ---- to and from workers in other processes (runtime/groups.py)

    def located(self, meta: KVBatchMeta) -> KVBatchMeta:
        """`meta` for a worker in another process (Ray with a driver index adds where its fields are now)."""
        return meta

    def commit_receipts(self, results: Any) -> Any:
        """Take workers' write receipts in `results` into this client's index (or note them for clears); returns
        `results` with each receipt replaced by the one the index gave back (metas are frozen: never changed)."""
        return results

    def footprint(self, partition_id: str) -> dict[str, int]:
        """The partition's index size: live keys, slots, tombstones, chunks, approximate bytes."""
        raise NotImplementedError

    @abc.abstractmethod
    def close(self) -> None:
        """Release the backend (idempotent)."""

    def __enter__(self) -> DataPlaneClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def replace_metas(results: Any, replace: Callable[[KVBatchMeta], KVBatchMeta], depth: int = 0) -> Any:
    """``results`` with every meta in it (itself, or inside a tuple, list or dict, two levels deep) replaced by
    ``replace(meta)``; the containers are new where a meta in them was, the rest is as it came."""
    if isinstance(results, KVBatchMeta):
        return replace(results)
    if depth >= 2:
        return results
    if isinstance(results, dict):
        return {k: replace_metas(v, replace, depth + 1) for k, v in results.items()}
    if isinstance(results, (tuple, list)):
        items = [replace_metas(v, replace, depth + 1) for v in results]
        if isinstance(results, list):
            return items
        return type(results)(*items) if hasattr(results, "_fields") else tuple(items)  # a named tuple stays one
    return results
