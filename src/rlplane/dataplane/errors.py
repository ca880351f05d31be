"""Data-plane errors for bad input, naming partition, keys and field (never a silent smaller batch)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "ClearedKeyError",
    "DataPlaneError",
    "DuplicateKeyError",
    "MissingFieldError",
    "MissingKeyError",
    "ShapeError",
    "UnknownPartitionError",
    "fmt_keys",
]


class DataPlaneError(ValueError):
    """Base class: a request the data plane cannot serve as asked."""


class UnknownPartitionError(DataPlaneError):
    """The partition was never registered (or was closed)."""


class MissingKeyError(DataPlaneError):
    """A requested key is not stored in the partition."""


class ClearedKeyError(DataPlaneError):
    """A key was cleared earlier in this partition and is written or read again."""


class MissingFieldError(DataPlaneError):
    """A field is not registered, or not yet written for some of the requested keys."""


class DuplicateKeyError(DataPlaneError):
    """The same key appears twice in one request (or twice across metas being concatenated)."""


class ShapeError(DataPlaneError):
    """A column's shape does not match the keys (first dimension) or the sequence lengths."""


def fmt_keys(keys: Sequence[str], limit: int = 5) -> str:
    """`['a', 'b', ...] (+12 more)`: enough keys to find the culprit without flooding a log line."""
    keys = list(keys)
    shown = ", ".join(repr(k) for k in keys[:limit])
    more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return f"[{shown}]{more}"
