"""A preallocated KV cache for the ``hf`` decode loop: ``(B, H, capacity, D)`` written in place, attention
over a view of the filled prefix (no per-step ``torch.cat``), stored in the autocast dtype."""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """One attention layer's keys/values in a buffer of fixed length ``capacity``."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self._k: torch.Tensor | None = None  # (B, H, capacity, D)
        self._v: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        n = key_states.shape[-2]
        if self._k is None:
            b, h, _, d = key_states.shape
            dtype = key_states.dtype
            if key_states.is_floating_point() and torch.is_autocast_enabled(key_states.device.type):
                dtype = torch.get_autocast_dtype(key_states.device.type)  # what attention would cast to
            self._k = key_states.new_empty((b, h, self.capacity, d), dtype=dtype)
            self._v = value_states.new_empty((b, h, self.capacity, value_states.shape[-1]), dtype=dtype)
            self.dtype, self.device = dtype, key_states.device
            self.is_initialized = True
        if self.length + n > self.capacity:
            raise RuntimeError(f"PreallocatedLayer: {self.length + n} positions exceed capacity {self.capacity}")
        self._k[:, :, self.length : self.length + n] = key_states
        self._v[:, :, self.length : self.length + n] = value_states
        self.length += n
        self.keys = self._k[:, :, : self.length]
        self.values = self._v[:, :, : self.length]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self._k is not None:
            self._k, self._v = self._k[indices], self._v[indices]
            self.keys = self._k[:, :, : self.length]
            self.values = self._v[:, :, : self.length]


def preallocated_cache(config, capacity: int) -> DynamicCache:
    """A ``DynamicCache`` whose full-attention layers are ``PreallocatedLayer``s (others keep transformers')."""
    cache = DynamicCache(config=config)
    if cache.layers and all(type(layer) is DynamicLayer for layer in cache.layers):
        cache.layers = [PreallocatedLayer(capacity) for _ in cache.layers]
    return cache
