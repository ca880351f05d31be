"""The key-value data plane: per-sample columns under keys, partitioned per step, sharded per DP rank.

    client = make_data_plane("memory")          # or "ray" (after ray.init)
    client.register_partition("train", ["input_ids", "generation_logprobs", "reward"], num_samples=B)
    meta = client.put_samples(ids, "train", {"input_ids": [ids_0, ids_1, ...], "reward": r})  # (B,)
    metas, inverse = shard_meta_for_dp(meta, dp_world=2)         # metadata only
    batch = client.get_samples(metas[0], None, ["input_ids"])    # {"input_ids": (B0, T)} padded
    client.put_samples(metas[0], None, {"prev_logprobs": lp})    # lp (B0, T): trimmed to lengths
    client.clear_samples(meta, None)

Only the `ray_*` modules import Ray, lazily.
"""

from __future__ import annotations

from typing import Any

from .codec import Column
from .errors import (
    ClearedKeyError,
    DataPlaneError,
    DuplicateKeyError,
    MissingFieldError,
    MissingKeyError,
    ShapeError,
    UnknownPartitionError,
)
from .interface import DEFAULT_TOKEN_FIELDS, DataPlaneClient
from .memory import MemoryDataPlane
from .meta import GLOBAL_PAD_KEY, PAD_MULTIPLE_KEY, KVBatchMeta, concat_metas
from .sharding import balance_rows, dp_shard_rows, global_pad_len, shard_meta_for_dp

__all__ = [
    "DEFAULT_TOKEN_FIELDS",
    "GLOBAL_PAD_KEY",
    "PAD_MULTIPLE_KEY",
    "ClearedKeyError",
    "Column",
    "DataPlaneClient",
    "DataPlaneError",
    "DuplicateKeyError",
    "KVBatchMeta",
    "MemoryDataPlane",
    "MissingFieldError",
    "MissingKeyError",
    "ShapeError",
    "UnknownPartitionError",
    "balance_rows",
    "concat_metas",
    "dp_shard_rows",
    "global_pad_len",
    "make_data_plane",
    "shard_meta_for_dp",
]

BACKENDS = ("memory", "ray")


def make_data_plane(backend: str = "memory", **options: Any) -> DataPlaneClient:
    """A data-plane client: "memory" (in-process) or "ray" (object store; needs ray.init).

    Options: token_fields, seq_len_field; ray: index ("store" | "driver", see `ray_index`), and with a store
    index name, owner ("producer" | "store"), attach.
    """
    if backend == "memory":
        return MemoryDataPlane(**options)
    if backend == "ray":
        index = options.get("index", "store")
        if index == "driver":
            extra = sorted(set(options) - {"token_fields", "seq_len_field", "index"})
            if extra:
                raise DataPlaneError(f"data_plane index = 'driver' takes no {extra}: the store actor's options "
                                     "(name, owner, attach) need index='store'")
        elif index != "store":
            raise DataPlaneError(f"data_plane index = {index!r}: choose 'store' or 'driver'")
        from .ray_backend import RayDataPlane

        return RayDataPlane(**options)
    raise DataPlaneError(f"data_plane.backend = {backend!r}: choose one of {list(BACKENDS)}")
