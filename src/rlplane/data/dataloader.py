"""A resumable, endless prompt loader: batches of ``num_prompts_per_step`` datums, epoch after epoch.

Why not torchdata's ``StatefulDataLoader``: its ``state_dict`` restores the position inside an
epoch, but the shuffle generator it restores is the one from the start of that epoch, so after a
resume every later epoch is shuffled differently from the uninterrupted run (checked with torchdata
0.11). Here the permutation of epoch ``e`` is a pure function of ``(seed, e)`` and the position is
the epoch and the prompts drawn in it, so a resumed run sees exactly the batches the uninterrupted run
would have seen. Counted in prompts, not batches, a position stays exact when the batch size changes
on resume: the epoch continues at the next prompt of its permutation.
Prompts are tokenized on access in the driver (microseconds each), so no worker processes are used.
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
    """Endless iterator over batches (``list[DatumSpec]``) with ``state_dict`` / ``load_state_dict``.

    Each epoch is a fresh permutation seeded by ``(seed, epoch)`` (``shuffle=False`` keeps dataset
    order); batches are consecutive slices of it, and the tail of an epoch too short for a batch is
    dropped so every step sees ``num_prompts_per_step`` prompts.
    """

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
        """Batches of the current epoch drawn, counted so that ``len(self) - batches_done_in_epoch`` batches
        are left in it (after a resume at another batch size the position need not be a whole batch)."""
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
        # A distinct, reproducible stream per (seed, epoch). (torch.Generator.manual_seed keeps only the
        # low 32 bits of a seed on CPU, so packing the pair into one int would collide; numpy's
        # SeedSequence hashes the pair.)
        return np.random.default_rng([self.seed & _U64, epoch]).permutation(n).tolist()

    def __next__(self) -> list[DatumSpec]:
        if self.prompts_done_in_epoch + self.num_prompts_per_step > len(self.dataset):
            self.epoch += 1
            self.prompts_done_in_epoch = 0
            self._order = None
        if self._order is None:
            self._order = self._epoch_order(self.epoch)
        start = self.prompts_done_in_epoch
        # Stamped with the epoch: the same prompt drawn in two epochs is two draws, sampled differently.
        batch = [dataclasses.replace(self.dataset[i], epoch=self.epoch)
                 for i in self._order[start : start + self.num_prompts_per_step]]
        self.prompts_done_in_epoch += self.num_prompts_per_step
        return batch

    def state_dict(self) -> dict[str, Any]:
        """The position (epoch, prompts drawn in it) and what makes it meaningful: the seed, the dataset
        size and ``shuffle`` (they fix the permutation), and the batch size it was drawn at."""
        return {"epoch": self.epoch, "prompts_done_in_epoch": self.prompts_done_in_epoch, "seed": self.seed,
                "dataset_size": len(self.dataset), "shuffle": self.shuffle,
                "num_prompts_per_batch": self.num_prompts_per_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at ``state``'s position. A state that counts batches (``batches_done_in_epoch``) is read
        at its ``num_prompts_per_batch`` (the caller adds it from the config it was saved with), else at
        this loader's batch size. A different seed, dataset size or shuffle is an error: the saved
        position would point into another permutation."""
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
