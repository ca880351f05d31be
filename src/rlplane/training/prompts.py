"""The session's data: the training prompt stream (an endless pass over the loader) and the
held-out problems, built from ``data.*`` before anything slow starts."""

from __future__ import annotations

from rlplane.config.schema import RunConfig
from rlplane.datasets import build_datasets


class Prompts:
    def __init__(self, cfg: RunConfig, tokenizer):
        self.loader, self.val_datums, self.stats = build_datasets(cfg, tokenizer)
        self._iter = iter(self.loader)
        # Where the loader's position is read for a checkpoint when the prompts are drawn in another
        # process (an async collector's copy of the loader); None: from this loader.
        self.state_from = None

    @property
    def dataset(self):
        return self.loader.dataset

    def next(self) -> list:
        """The next batch of prompts; a new epoch starts when the loader runs out."""
        try:
            return next(self._iter)
        except StopIteration:
            self._iter = iter(self.loader)
            return next(self._iter)

    def state_dict(self) -> dict:
        return self.loader.state_dict() if self.state_from is None else self.state_from()

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)
        self._iter = iter(self.loader)
