"""A cheap, deterministic fingerprint of named weights: what a refit sent, and what a generator holds.

Per tensor: name, shape, a hash of ``SAMPLES`` elements at fixed positions (float32 bits: equal on any
device) and the float32 sum of all (equal within ``SUM_RTOL`` of the tensor's mass: devices and thread
counts sum in another order). docs/weight_sync.md says what it finds.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

SAMPLES = 256  # sampled elements per tensor
_STRIDE = 2_654_435_761  # Knuth's multiplicative-hash constant: sampled positions spread over the tensor
SUM_RTOL = 1e-5  # float32 sums of the same tensor in another order agree far closer than this


@dataclass(frozen=True)
class TensorPrint:
    shape: tuple[int, ...]
    sample: str  # blake2b of the sampled elements' float32 bytes
    total: float  # float32 sum of every element
    mass: float  # numel · mean |sampled element|: the sum's tolerance scale


@dataclass(frozen=True)
class Fingerprint:
    tensors: tuple[tuple[str, TensorPrint], ...]  # sorted by name

    @property
    def digest(self) -> str:
        """8 hex digits over names, shapes and sampled values."""
        h = hashlib.blake2b(digest_size=4)
        for name, t in self.tensors:
            h.update(f"{name}{t.shape}{t.sample}".encode())
        return h.hexdigest()


@functools.lru_cache(maxsize=256)
def _sample_positions(numel: int, device: torch.device) -> torch.Tensor:
    n = min(numel, SAMPLES)
    return (torch.arange(n, dtype=torch.long) * _STRIDE % numel).to(device)


@torch.no_grad()
def tensor_print(t: torch.Tensor) -> TensorPrint:
    flat = t.detach().reshape(-1)
    if flat.numel() == 0:
        return TensorPrint(tuple(t.shape), "", 0.0, 0.0)
    picked = flat[_sample_positions(flat.numel(), flat.device)]  # (<= SAMPLES,)
    values = (picked if picked.dtype == torch.float32 else picked.float()).cpu().numpy()
    total = float(flat.sum(dtype=torch.float32)) if flat.is_floating_point() else float(flat.sum())
    return TensorPrint(tuple(t.shape), hashlib.blake2b(values.tobytes(), digest_size=8).hexdigest(), total,
                       float(np.abs(values).mean()) * flat.numel())


def fingerprint(weights: Mapping[str, torch.Tensor], names: Iterable[str] | None = None) -> Fingerprint:
    """Of ``weights`` (only ``names``; a name ``weights`` lacks is left out: missing when compared)."""
    keys = sorted(set(weights if names is None else names) & set(weights))
    return Fingerprint(tuple((k, tensor_print(weights[k])) for k in keys))


def difference(expected: Fingerprint, actual: Fingerprint) -> str | None:
    """The first difference, in words, or None."""
    want, have = dict(expected.tensors), dict(actual.tensors)
    if missing := sorted(set(want) - set(have)):
        return f"{len(missing)} tensors missing ({missing[0]}, ...)"
    if extra := sorted(set(have) - set(want)):
        return f"{len(extra)} tensors not sent ({extra[0]}, ...)"
    for name, w in want.items():
        h = have[name]
        if w.shape != h.shape:
            return f"{name} has shape {list(h.shape)}, sent {list(w.shape)}"
        if w.sample != h.sample:
            return f"{name} differs (sampled values)"
        if abs(w.total - h.total) > SUM_RTOL * max(w.mass, h.mass, 1e-30):
            return f"{name} differs (sum {h.total:.6g}, sent {w.total:.6g})"
    return None
