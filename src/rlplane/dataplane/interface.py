"""`DataPlaneClient`: the one interface every part of rlplane uses to move bulk per-sample data.

The interface mirrors NeMo RL's `DataPlaneClient` (direct-by-key half) so a TransferQueue adapter
can sit behind it later. `IndexedClient` (`client.py`) implements it for every backend here.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from .columns import TOKEN_COLUMNS
from .meta import KVBatchMeta

__all__ = ["DEFAULT_TOKEN_FIELDS", "DataPlaneClient", "FieldValue", "SampleIds", "receipts_in"]

# Per-token ("token-aligned") fields: jagged in storage, trimmed to the sequence length on write,
# padded to a common length on read. Declared once, with the other columns, in `columns.py`.
DEFAULT_TOKEN_FIELDS = TOKEN_COLUMNS

FieldValue = torch.Tensor | Sequence[torch.Tensor]
SampleIds = Sequence[str] | KVBatchMeta


class DataPlaneClient(abc.ABC):
    """Per-sample columns under string keys, grouped in partitions (one per step and stage)."""

    @abc.abstractmethod
    def register_partition(
        self, partition_id: str, fields: Sequence[str], num_samples: int, *, task_name: str | None = None
    ) -> None:
        """Declare a partition and the fields it may hold. Re-registering widens the field list; an
        empty partition (all keys cleared) starts afresh. `num_samples` is the expected number of
        samples, used by `status`/`is_complete`; it is not a capacity limit."""

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
        """Write `fields` for `sample_ids` (a list of keys, or a meta whose keys, lengths, tags and
        extra_info are carried into the result). Each field is a (B, ...) tensor or a list of B
        tensors of different first-dim lengths (jagged). Rewriting a field of a key replaces it.
        `shards`: row indices of each part the readers will fetch (`dp_shard_rows` for DP ranks),
        every row once; a backend across processes stores each part apart, so a reader fetches
        only its own. Returns the receipt: fields = the meta's fields (if a meta was given) + the
        fields written."""

    @abc.abstractmethod
    def get_samples(
        self,
        sample_ids: SampleIds,
        partition_id: str | None,
        select_fields: Sequence[str],
        pad_values: Mapping[str, float | int | bool] | None = None,
        pad_to: int | None = None,
    ) -> dict[str, torch.Tensor]:
        """Fresh tensors for `select_fields` (required) in the order of `sample_ids`. Jagged fields come
        back padded (B, T, ...) with `pad_values[field]` (default: the column's declared pad, `columns.py`).
        Per-token fields share one T: `pad_to`, else the meta's `extra_info["global_forward_pad_seqlen"]`,
        else the longest row."""

    @abc.abstractmethod
    def clear_samples(self, sample_ids: SampleIds | None, partition_id: str | None, *, wait: bool = True) -> int | None:
        """Forget `sample_ids` (every live key if None) and free their storage; returns the count.
        Writing or reading a cleared key raises `ClearedKeyError` until a new key takes its slot (so
        the index stays O(live keys), `partition.py`); after that it is an unknown key. Mint new keys
        for new samples.

        `wait=False` (a step's final clear, whose answer nobody needs) lets a remote backend return
        at once and return None; if the store refuses the clear, this client's next call raises
        the error (same class and message). Local backends clear synchronously either way."""

    @abc.abstractmethod
    def list_samples(self, partition_id: str) -> list[str]:
        """Live keys of the partition, in first-write order."""

    @abc.abstractmethod
    def meta_for(self, partition_id: str, sample_ids: Sequence[str] | None = None) -> KVBatchMeta:
        """A receipt rebuilt from the index: the fields written for all of `sample_ids` (default: every
        live key), their stored lengths and tags."""

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
        """Start moving the data `meta`'s receipts locate to this process's node and return at once:
        a hint that a `get_samples` of it follows (a driver handed a DP rank's write-back receipt
        while the other ranks still work). Backends whose data is already here do nothing."""

    # ---- the way to and from workers in other processes (runtime/groups.py calls these) ----------

    def located(self, meta: KVBatchMeta) -> KVBatchMeta:
        """`meta` as a worker in another process is to be handed it. A backend whose workers cannot
        ask the index (Ray with the index in the driver) puts in it where its keys' fields are now;
        the others hand it on as it is."""
        return meta

    def commit_receipts(self, results: Any) -> None:
        """Take the write receipts (metas) in workers' `results` into this client's index: how a
        worker's write reaches an index held by the driver. Backends whose index took the write
        when it was made only note the receipts (so a clear can drop what they hold)."""

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


def receipts_in(results: Any) -> Iterator[KVBatchMeta]:
    """The metas in workers' results: a meta, or one inside a tuple, list or dict of them (two levels:
    a list of ranks' results, each a meta or a tuple holding one)."""
    stack = [(results, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, KVBatchMeta):
            yield value
        elif depth < 2 and isinstance(value, (tuple, list)):
            stack.extend((v, depth + 1) for v in value)
        elif depth < 2 and isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
