"""The per-step lifecycle the trainer follows, as small functions over a client and a meta.

    register_step  -> register the step's partition (the fields it may hold)
    first_write    -> rollout writes token ids, logprobs, masks; the driver keeps the receipt
    read_columns   -> the driver (or a worker) reads a few columns, padded to the global length
    write_columns  -> logprobs / advantages written back under the same keys
    keep_samples / drop_samples -> filtered samples (dynamic sampling) are cleared mid-step
    finish_step    -> the step's keys are cleared, freeing their storage
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .client import DataPlaneClient, FieldValue
from .errors import DataPlaneError
from .meta import GLOBAL_PAD_KEY, PAD_MULTIPLE_KEY, KVBatchMeta
from .sharding import global_pad_len

__all__ = [
    "drop_samples",
    "finish_step",
    "first_write",
    "keep_samples",
    "mint_sample_ids",
    "read_columns",
    "register_step",
    "stamp_pad_seqlen",
    "write_columns",
]


def mint_sample_ids(prompt_uids: Sequence[str], group_size: int) -> list[str]:
    """Keys for `group_size` generations of each prompt: `{prompt_uid}_g{i}` (NeMo RL's scheme)."""
    return [f"{uid}_g{i}" for uid in prompt_uids for i in range(group_size)]


def register_step(
    client: DataPlaneClient, partition_id: str, fields: Sequence[str], num_samples: int, task_name: str | None = None
) -> None:
    client.register_partition(partition_id, fields, num_samples, task_name=task_name)


def stamp_pad_seqlen(meta: KVBatchMeta, pad_to_multiple: int | None = None) -> KVBatchMeta:
    """Meta with `global_forward_pad_seqlen` = max(seq_lens) rounded up (idempotent if already set)."""
    if GLOBAL_PAD_KEY in meta.extra_info or meta.seq_lens is None:
        return meta
    multiple = pad_to_multiple if pad_to_multiple is not None else meta.extra_info.get(PAD_MULTIPLE_KEY, 1)
    return meta.with_extra_info(**{GLOBAL_PAD_KEY: global_pad_len(meta.seq_lens, multiple)})


def first_write(
    client: DataPlaneClient,
    sample_ids: Sequence[str],
    partition_id: str,
    fields: Mapping[str, FieldValue],
    *,
    tags: Sequence[Mapping[str, Any]] | None = None,
    extra_info: Mapping[str, Any] | None = None,
    pad_to_multiple: int | None = None,
) -> KVBatchMeta:
    """Rollout's write of a new batch; the receipt carries extra_info and the pad multiple."""
    meta = client.put_samples(sample_ids, partition_id, fields, tags)
    info = dict(extra_info or {})
    if pad_to_multiple is not None and pad_to_multiple > 1:
        info[PAD_MULTIPLE_KEY] = pad_to_multiple
    return meta.with_extra_info(**info)


def read_columns(
    client: DataPlaneClient,
    meta: KVBatchMeta,
    select_fields: Sequence[str],
    pad_values: Mapping[str, float | int | bool] | None = None,
) -> dict[str, torch.Tensor]:
    """`select_fields` for the meta's rows, per-token fields padded to the global pad length."""
    return client.get_samples(stamp_pad_seqlen(meta), None, select_fields, pad_values)


def write_columns(client: DataPlaneClient, meta: KVBatchMeta, fields: Mapping[str, FieldValue]) -> KVBatchMeta:
    """Write new columns (padded (B, T) is fine for per-token ones) under the meta's keys."""
    return client.put_samples(meta, None, fields)


def drop_samples(client: DataPlaneClient, meta: KVBatchMeta, sample_ids: Sequence[str]) -> KVBatchMeta:
    """Clear `sample_ids` from storage now and return the meta without them."""
    remaining = meta.drop(sample_ids)
    if sample_ids:
        client.clear_samples(list(sample_ids), meta.partition_id)
    return remaining


def keep_samples(client: DataPlaneClient, meta: KVBatchMeta, keep: Sequence[bool] | torch.Tensor) -> KVBatchMeta:
    """Keep rows where `keep` is true; clear the others from storage (dynamic sampling's filter)."""
    keep = [bool(k) for k in (keep.tolist() if isinstance(keep, torch.Tensor) else keep)]
    if len(keep) != len(meta):
        raise DataPlaneError(
            f"partition {meta.partition_id!r}: keep mask has {len(keep)} entries for {len(meta)} rows"
        )
    dropped = [s for s, k in zip(meta.sample_ids, keep) if not k]
    return drop_samples(client, meta, dropped)


def finish_step(client: DataPlaneClient, meta: KVBatchMeta) -> int:
    """Clear every key of the step; returns how many were cleared."""
    return client.clear_samples(list(meta.sample_ids), meta.partition_id) if len(meta) else 0
