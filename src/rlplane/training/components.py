"""Parts of a run given as objects (NeMo RL's ``grpo_train`` arguments that map onto a session's parts).

``loss_fn``: the policy's loss (:class:`rlplane.workers.policy.PolicyLoss`); ``dataset`` (``DatumSpec``
records) or ``dataloader`` (a ``PromptDataLoader``) instead of ``data.*``, ``val_dataset`` (default: the
first ``max_val_samples`` training prompts); ``logger``: ``log_metrics(metrics, step)`` or
``log(metrics, step)``, besides rlplane's sinks. ``rlplane.train`` registers ``task_to_env`` objects."""

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
    """A user's logger as one more metrics sink: metric rows only (keys keep their ``train/`` prefixes)."""

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
