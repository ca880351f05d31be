"""Parts of a run given as Python objects instead of config keys (NeMo RL's ``grpo_train(policy, ...,
dataloader, ..., loss_fn, task_to_env, logger, ...)`` arguments that map onto a session's parts).

``loss_fn``: the policy's loss (the ``columns()`` / ``__call__`` protocol of
:class:`rlplane.workers.policy.PolicyLoss`), instead of the recipe's own. ``dataset`` (``DatumSpec``
records, e.g. an :class:`~rlplane.data.tasks.AllTaskProcessedDataset`) or ``dataloader`` (a
:class:`~rlplane.data.PromptDataLoader`): the training prompts instead of ``data.*``; ``val_dataset``
the held-out ones (default: the first ``max_val_samples`` of the training prompts). ``logger``: an
object with NeMo RL's ``log_metrics(metrics, step, prefix="")`` (or ``log(metrics, step)``), sent every
logged row besides rlplane's own sinks. Environment objects (``task_to_env``) are registered by
``rlplane.train`` for the run (``runtime: local``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Components:
    loss_fn: Any = None
    dataset: Any = None
    val_dataset: Any = None
    dataloader: Any = None
    logger: Any = None


class LoggerSink:
    """A user's logger as one more metrics sink: metrics rows only (rlplane's keys keep their
    ``train/`` / ``validation/`` prefixes); sample tables stay in samples.jsonl; closing is the owner's."""

    def __init__(self, logger: Any):
        self.logger = logger

    def log(self, metrics: dict, step: int) -> None:
        if hasattr(self.logger, "log_metrics"):
            self.logger.log_metrics(metrics, step)
        else:
            self.logger.log(metrics, step)

    def log_samples(self, kind: str, step: int, rows: list[dict]) -> None:
        pass

    def close(self) -> None:
        pass
