"""One partition of the key index: keys -> slots, and per slot the fields' (chunk id, row), length and tags.

A cleared key's tombstone lives in its slot until the next new key reuses it, so size stays O(live keys).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import sys

import numpy as np

__all__ = ["PENDING", "Partition", "Pending"]


class Pending:
    """Payload of a chunk committed before its data was stored; `attach` replaces it, a reader retries."""

    def __repr__(self) -> str:
        return "PENDING"

    def __eq__(self, other: object) -> bool:  # survives pickling to another process
        return isinstance(other, Pending)

    def __hash__(self) -> int:
        return 0


PENDING = Pending()


@dataclasses.dataclass
class Partition:
    """One partition's table: keys -> slots, and per slot the field locations, length and tags."""

    fields: list[str]
    num_samples: int
    task_name: str | None
    slot_of: dict[str, int] = dataclasses.field(default_factory=dict)  # live keys, first-write order
    cleared: dict[str, int] = dataclasses.field(default_factory=dict)  # tombstones: key -> the slot it had
    free: list[int] = dataclasses.field(default_factory=list)  # cleared slots, oldest first: reused first
    chunks: dict[int, list] = dataclasses.field(default_factory=dict)  # chunk id -> [payload, live rows]
    loc: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # field -> (2, cap): chunk, row
    seq_len: np.ndarray = dataclasses.field(default_factory=lambda: np.full(64, -1, dtype=np.int64))
    key_at: np.ndarray = dataclasses.field(default_factory=lambda: np.full(64, None, dtype=object))  # slot -> key
    tags: list = dataclasses.field(default_factory=list)  # slot -> dict | None
    num_slots: int = 0

    def grow(self, need: int) -> None:
        cap = len(self.seq_len)
        if need <= cap:
            return
        new_cap = max(need, 2 * cap)
        self.seq_len = np.concatenate([self.seq_len, np.full(new_cap - cap, -1, dtype=np.int64)])
        self.key_at = np.concatenate([self.key_at, np.full(new_cap - cap, None, dtype=object)])
        for f, arr in self.loc.items():
            self.loc[f] = np.concatenate([arr, np.full((2, new_cap - cap), -1, dtype=np.int64)], axis=1)

    def take_slots(self, keys: list[str]) -> np.ndarray:
        """Slots for new `keys`: cleared ones first (their tombstones go), then fresh ones at the end."""
        reused = self.free[: len(keys)]
        del self.free[: len(reused)]
        if reused:
            # their tombstones go (a C-level loop)
            collections.deque(map(self.cleared.pop, self.key_at[reused].tolist(), itertools.repeat(None)), 0)
        num_new = len(keys) - len(reused)
        self.grow(self.num_slots + num_new)
        slots = np.concatenate([np.asarray(reused, dtype=np.int64),
                                np.arange(self.num_slots, self.num_slots + num_new, dtype=np.int64)])
        self.num_slots += num_new
        self.tags.extend(itertools.repeat(None, num_new))
        self.slot_of.update(zip(keys, slots.tolist()))
        self.key_at[slots] = keys
        return slots

    def footprint(self) -> dict[str, int]:
        """Live keys, slots, tombstones, chunks, and approximate bytes of the index structures (no payloads)."""
        keys = sum(map(sys.getsizeof, self.slot_of)) + sum(map(sys.getsizeof, self.cleared))
        containers = sum(map(sys.getsizeof, (self.slot_of, self.cleared, self.free, self.chunks, self.tags)))
        arrays = self.seq_len.nbytes + self.key_at.nbytes + sum(a.nbytes for a in self.loc.values())
        tags = sum(sys.getsizeof(t) for t in self.tags if t)
        return {"live_keys": len(self.slot_of), "slots": self.num_slots, "tombstones": len(self.cleared),
                "chunks": len(self.chunks), "bytes": keys + containers + arrays + tags}

    def field_loc(self, field: str) -> np.ndarray:
        arr = self.loc.get(field)
        if arr is None:
            arr = self.loc[field] = np.full((2, len(self.seq_len)), -1, dtype=np.int64)
        return arr
