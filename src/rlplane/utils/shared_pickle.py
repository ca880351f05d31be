"""Pickling for a pipe between local processes: large tensors as shared-memory handles, small ones by value
(below ``SMALL_TENSOR_BYTES`` a segment's set-up costs more than the bytes)."""

from __future__ import annotations

import io
import pickle
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch
import torch.multiprocessing  # noqa: F401 - registers torch's shared-memory reductions with ForkingPickler

__all__ = ["SMALL_TENSOR_BYTES", "dumps"]

SMALL_TENSOR_BYTES = 64 * 1024


def _tensor_from_array(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array)


class _Pickler(ForkingPickler):
    _extra_reducers = dict(ForkingPickler._extra_reducers)  # torch's, taken at import


_shared_reduce = _Pickler._extra_reducers[torch.Tensor]


def _reduce_tensor(t: torch.Tensor):
    small = t.numel() * t.element_size() <= SMALL_TENSOR_BYTES
    if small and type(t) is torch.Tensor and t.device.type == "cpu" and not t.is_shared() and not t.requires_grad:
        try:
            return _tensor_from_array, (t.numpy().copy(),)  # a copy: exactly its bytes, not a view's storage
        except TypeError:  # a dtype numpy lacks (bfloat16): shared memory as for a large one
            pass
    return _shared_reduce(t)


_Pickler._extra_reducers[torch.Tensor] = _reduce_tensor


def dumps(obj: Any) -> bytes:
    """``obj`` pickled for ``Connection.send_bytes`` (the receiver's ``recv`` unpickles it)."""
    buf = io.BytesIO()
    _Pickler(buf, pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()
