"""The session's data: the training prompt stream (endless over the loader) and the held-out problems.

Each step's record for ``logs/prompts.jsonl`` (drawn and trained ``[epoch, idx]``) shows, with resumes,
that every prompt was trained exactly once.
"""

from __future__ import annotations

from rlplane.config.data import DatasetOptions
from rlplane.datasets import build_datasets


class Prompts:
    def __init__(self, options: DatasetOptions, tokenizer):
        self.loader, self.val_datums, self.stats = build_datasets(options, tokenizer)
        self._iter = iter(self.loader)
        self._drawn: list[list[int]] = []  # this step's draws, [epoch, idx]
        self._trained: list[int] | None = None  # positions in _drawn of the prompts trained on (None: all)
        # Where a checkpoint reads the loader position when another process draws (async); None: this loader.
        self.state_from = None

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
        return self.loader.state_dict() if self.state_from is None else self.state_from()

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)
        self._iter = iter(self.loader)
