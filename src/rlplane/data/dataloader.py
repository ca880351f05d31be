"""A resumable, endless prompt loader: batches of ``num_prompts_per_step`` datums, epoch after epoch.

Not torchdata's ``StatefulDataLoader``: after a resume it shuffles later epochs differently. Here epoch
``e``'s permutation is a function of ``(seed, e)`` and the position is counted in prompts, so a resumed
run (even at another batch size) draws exactly what the uninterrupted run would.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from rlplane.data.datum import DatumSpec
from rlplane.data.errors import DatasetError

_U64 = 2**64 - 1  # SeedSequence takes non-negative ints; negative seeds wrap


class PromptDataLoader:
    """Endless batches (``list[DatumSpec]``) of a per-epoch permutation seeded by ``(seed, epoch)`` (or dataset
    order); an epoch's tail shorter than a batch is dropped. Has ``state_dict`` / ``load_state_dict``."""

    def __init__(self, dataset: Dataset, num_prompts_per_step: int, *, seed: int = 0, shuffle: bool = True):
        if num_prompts_per_step < 1:
            raise DatasetError(f"num_prompts_per_step = {num_prompts_per_step}: must be >= 1")
        if len(dataset) < num_prompts_per_step:
            raise DatasetError(
                f"dataset has {len(dataset)} prompts, fewer than num_prompts_per_step = {num_prompts_per_step}; "
                "add prompts or lower grpo.num_prompts_per_step"
            )
        self.dataset, self.num_prompts_per_step, self.seed, self.shuffle = dataset, num_prompts_per_step, seed, shuffle
        self.epoch = 0
        self.prompts_done_in_epoch = 0  # position in the epoch's permutation
        self._order: list[int] | None = None  # permutation of the current epoch, built lazily

    def __len__(self) -> int:
        """Batches per epoch."""
        return len(self.dataset) // self.num_prompts_per_step

    @property
    def batches_done_in_epoch(self) -> int:
        """Batches of this epoch drawn, so ``len(self) - batches_done_in_epoch`` are left (may be fractional)."""
        return len(self) - (len(self.dataset) - self.prompts_done_in_epoch) // self.num_prompts_per_step

    @batches_done_in_epoch.setter
    def batches_done_in_epoch(self, batches: int) -> None:
        self.prompts_done_in_epoch = batches * self.num_prompts_per_step

    def __iter__(self) -> PromptDataLoader:
        return self

    def _epoch_order(self, epoch: int) -> list[int]:
        n = len(self.dataset)
        if not self.shuffle:
            return list(range(n))
        # A reproducible stream per (seed, epoch): SeedSequence hashes the pair (manual_seed keeps 32 bits).
        return np.random.default_rng([self.seed & _U64, epoch]).permutation(n).tolist()

    def __next__(self) -> list[DatumSpec]:
        if self.prompts_done_in_epoch + self.num_prompts_per_step > len(self.dataset):
            self.epoch += 1
            self.prompts_done_in_epoch = 0
            self._order = None
        if self._order is None:
            self._order = self._epoch_order(self.epoch)
        start = self.prompts_done_in_epoch
        # Stamped with the epoch: one prompt in two epochs is two draws.
        batch = [dataclasses.replace(self.dataset[i], epoch=self.epoch)
                 for i in self._order[start : start + self.num_prompts_per_step]]
        self.prompts_done_in_epoch += self.num_prompts_per_step
        return batch

    def state_dict(self) -> dict[str, Any]:
        """The position (epoch, prompts drawn) with the seed, dataset size, ``shuffle`` and batch size."""
        return {"epoch": self.epoch, "prompts_done_in_epoch": self.prompts_done_in_epoch, "seed": self.seed,
                "dataset_size": len(self.dataset), "shuffle": self.shuffle,
                "num_prompts_per_batch": self.num_prompts_per_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at ``state``'s position (a batch-counting state at its ``num_prompts_per_batch``); another
        seed, dataset size or shuffle is an error (another permutation)."""
        fix = "resume with the original setting, or start a new run_dir"
        for key, now in (("seed", self.seed), ("dataset_size", len(self.dataset)), ("shuffle", self.shuffle)):
            if key in state and type(now)(state[key]) != now:
                raise DatasetError(f"dataloader state was saved with {key} {state[key]}, "
                                   f"this run has {key} {now}; {fix}")
        if "prompts_done_in_epoch" in state:
            done = int(state["prompts_done_in_epoch"])
        else:
            done = int(state["batches_done_in_epoch"]) * int(state.get("num_prompts_per_batch",
                                                                        self.num_prompts_per_step))
        self.epoch = int(state["epoch"])
        self.prompts_done_in_epoch = done
        self._order = None
