"""`memory` backend: columns and index in the caller's process (one-process runs, tests).

Reads gather into fresh tensors; pickling is refused; threads share it, index calls under one lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from .client import IndexedClient, encoded
from .codec import Column
from .columns import INPUT_IDS
from .errors import DataPlaneError
from .index import LookupPlan, PlaneIndex
from .interface import DEFAULT_TOKEN_FIELDS

__all__ = ["MemoryDataPlane"]


class MemoryDataPlane(IndexedClient):
    """In-process data plane."""

    def __init__(self, token_fields: Iterable[str] = DEFAULT_TOKEN_FIELDS, seq_len_field: str = INPUT_IDS) -> None:
        super().__init__(token_fields, seq_len_field)
        self.index = PlaneIndex()
        self._lock = threading.Lock()

    def _index_call(self, method: Callable, *args: Any) -> Any:
        with self._lock:
            result = method(self.index, *args)
            self.index.freed.clear()
            return result

    def _commit(self, pid, ids, columns, spec, bounds):
        return self._index_call(PlaneIndex.commit, pid, ids, encoded(columns), spec), ()

    def _fetch(self, plan: LookupPlan) -> dict[str, list[tuple[Column, list[int], list[int]]]]:
        return plan.parts

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.index = PlaneIndex()

    def __reduce__(self):
        raise DataPlaneError(
            "the memory data plane lives in one process and cannot be sent to another; "
            "use make_data_plane('ray') to share a plane with Ray workers"
        )
