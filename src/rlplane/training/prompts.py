"""The session's data: the training prompt stream (endless over the loader) and the held-out problems.

Each step's record for ``logs/prompts.jsonl`` (drawn and trained ``[epoch, idx]``) shows, with resumes,
that every prompt was trained exactly once.
"""

from __future__ import annotations

from collections.abc import Callable

from rlplane.config.data import DatasetOptions
from rlplane.data import PromptDataLoader
from rlplane.datasets import build_datasets
from rlplane.envs import check_task_names


class Prompts:
    """``dataset`` / ``dataloader`` / ``val_dataset``: given objects instead of ``data.*`` (``Components``);
    ``state_from``: where a checkpoint reads the loader position when another process may be drawing the prompts
    (async GRPO's collector; it answers None while this loader is the one drawing)."""

    def __init__(self, options: DatasetOptions, tokenizer, *, dataset=None, dataloader=None, val_dataset=None,
                 state_from: Callable[[], dict | None] | None = None):
        if dataset is None and dataloader is None:
            self.loader, self.val_datums, self.stats = build_datasets(options, tokenizer)
        else:
            self.loader = dataloader or PromptDataLoader(dataset, options.prompts_per_batch, seed=options.seed,
                                                         shuffle=options.data.shuffle)
            self.stats = {}
        if val_dataset is not None or dataset is not None or dataloader is not None:
            val = val_dataset if val_dataset is not None else self.loader.dataset
            self.val_datums = [val[i] for i in range(min(len(val), options.max_val_samples))]
            check_task_names((d.task_name for d in self.val_datums), "val_dataset")
            if dataset is not None or dataloader is not None:
                check_task_names((self.loader.dataset[i].task_name for i in range(len(self.loader.dataset))),
                                 "dataset")
        self._iter = iter(self.loader)
        self._drawn: list[list[int]] = []  # this step's draws, [epoch, idx]
        self._trained: list[int] | None = None  # positions in _drawn of the prompts trained on (None: all)
        self.state_from = state_from

    @property
    def dataset(self):
        return self.loader.dataset

    def next(self) -> list:
        """The next batch of prompts; a new epoch starts when the loader runs out."""
        try:
            batch = next(self._iter)
        except StopIteration:
            self._iter = iter(self.loader)
            batch = next(self._iter)
        self._drawn += [[d.epoch, d.idx] for d in batch]
        return batch

    def note_trained(self, positions: list[int]) -> None:
        """The step trains on the prompts drawn at ``positions`` (in draw order) only."""
        self._trained = sorted(positions)

    def note_served(self, trained: list[list[int]], evicted: list[list[int]]) -> None:
        """Async GRPO: the step trained the collector's groups ``trained`` ([epoch, idx]); ``evicted`` were drawn,
        never trained. Recorded as drawn = evicted then trained."""
        self._drawn = [*evicted, *trained]
        self._trained = list(range(len(evicted), len(self._drawn)))

    def take_step_record(self) -> dict | None:
        """The step's ``{"drawn": [[epoch, idx], ...], "trained": [...]}`` (None if none), resetting the record."""
        drawn, trained = self._drawn, self._trained
        self._drawn, self._trained = [], None
        if not drawn:
            return None
        return {"drawn": drawn, "trained": drawn if trained is None else [drawn[i] for i in trained]}

    def state_dict(self) -> dict:
        state = self.state_from() if self.state_from is not None else None
        return self.loader.state_dict() if state is None else state

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)
        self._iter = iter(self.loader)
