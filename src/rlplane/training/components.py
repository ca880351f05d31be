"""Parts of a run given as objects (NeMo RL's ``grpo_train`` arguments that map onto a session's parts).

``loss_fn``: the policy's loss (:class:`rlplane.workers.policy.PolicyLoss`); ``dataset`` (``DatumSpec``
records) or ``dataloader`` (a ``PromptDataLoader``) instead of ``data.*``, ``val_dataset`` (default: the
first ``max_val_samples`` training prompts); ``logger``: ``log_metrics(metrics, step)`` or
``log(metrics, step)``, besides rlplane's sinks. ``rlplane.train`` registers ``task_to_env`` objects.

``policy``, ``policy_generation``, ``checkpointer``: an object with the methods in :data:`NEEDS`, used in
place of the session's own, or a function (or class) of the session's own returning one (a wrapper).
A recipe's own long-lived part beside the session's workers is a :class:`SidePart`.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rlplane.dataplane import KVBatchMeta
from rlplane.dataplane.columns import PREV_LOGPROBS, REFERENCE_LOGPROBS
from rlplane.errors import ConfigError
from rlplane.training.loop import TrainingStopped
from rlplane.workers.policy import PolicyWorker

# What the session calls on each injectable part.
NEEDS = {
    "policy": ("get_logprobs_from_meta", "get_reference_policy_logprobs_from_meta", "train_from_meta"),
    "policy_generation": ("rollout", "set_weight_version", "update_weights"),
    "checkpointer": ("check_resume", "attach", "restore", "due", "save"),
}


@dataclass
class Components:
    loss_fn: Any = None
    dataset: Any = None
    val_dataset: Any = None
    dataloader: Any = None
    logger: Any = None
    policy: Any = None
    policy_generation: Any = None
    checkpointer: Any = None

    def check(self) -> None:
        """Parts given as objects (not as wrappers of the session's own) have what the session calls."""
        for name in NEEDS:
            given = getattr(self, name)
            if given is not None and not _is_wrapper(given, name):
                _check(name, given)
        if self.logger is not None and not any(callable(getattr(self.logger, m, None)) for m in ("log_metrics", "log")):
            raise ConfigError([f"rlplane.train(logger=...): {type(self.logger).__name__} has no log_metrics(metrics, "
                               "step) or log(metrics, step); give an object with one of them"])

    def use(self, name: str, built: Any) -> Any:
        """The part to use for ``name``: the given object, the given wrapper applied to ``built``, or ``built``."""
        given = getattr(self, name)
        if given is None:
            return built
        return _check(name, given(built) if _is_wrapper(given, name) else given)


def _is_wrapper(given: Any, name: str) -> bool:
    return callable(given) and (isinstance(given, type) or not all(hasattr(given, m) for m in NEEDS[name]))


def _check(name: str, obj: Any) -> Any:
    missing = [m for m in NEEDS[name] if not callable(getattr(obj, m, None))]
    if missing:
        raise ConfigError([f"rlplane.train({name}=...): {type(obj).__name__} has no {', '.join(missing)}; give an "
                           f"object with {', '.join(NEEDS[name])}, or a function of the run's own {name}"])
    return obj


class DataPlanePolicy:
    """The policy ranks as NeMo RL's data-plane policy (``TQPolicy``'s ``*_from_meta`` calls): each call shards
    ``meta`` over the ranks, which read their columns from the plane and write their results back."""

    def __init__(self, group, train_global_batch_size: int):
        self.group, self.train_global_batch_size = group, train_global_batch_size

    def get_logprobs_from_meta(self, meta: KVBatchMeta, micro_batch_size: int | None = None, timer=None) -> None:
        """``prev_logprobs`` under the trained weights; ``micro_batch_size`` None: ``policy.logprob_batch_size``;
        ``timer``: a :class:`~rlplane.training.loop.Timer` the call is timed in (NeMo RL's nested timing)."""
        with _timed(timer, "policy_logprobs"):
            self.group.run_sharded(PolicyWorker.compute_logprobs, meta, out_field=PREV_LOGPROBS,
                                   **_given(micro_batch_size=micro_batch_size))

    def get_reference_policy_logprobs_from_meta(self, meta: KVBatchMeta, micro_batch_size: int | None = None,
                                                timer=None) -> None:
        """``reference_policy_logprobs`` (temperature only) under the frozen initial weights."""
        with _timed(timer, "reference_policy_logprobs"):
            self.group.run_sharded(PolicyWorker.compute_logprobs, meta, out_field=REFERENCE_LOGPROBS, reference=True,
                                   **_given(micro_batch_size=micro_batch_size))

    def train_from_meta(self, meta: KVBatchMeta, loss_fn, eval_mode: bool = False, gbs: int | None = None,
                        mbs: int | None = None, timer=None) -> list[dict[str, float]]:
        """One training pass (``eval_mode``: loss and metrics only); the ranks' metrics, one dict each."""
        extra = _given(eval_mode=eval_mode or None, gbs=gbs, mbs=mbs)
        with _timed(timer, "policy_training"):
            return self.group.run_sharded(PolicyWorker.train, meta, batch_size=gbs or self.train_global_batch_size,
                                          loss=loss_fn, **extra)


def _timed(timer, name: str):
    return timer(name) if timer is not None else contextlib.nullcontext()


def _given(**kwargs) -> dict:
    """Only the arguments set: ranks that take no per-call sizes keep working with the defaults."""
    return {k: v for k, v in kwargs.items() if v is not None}


class LoggerSink:
    """A user's logger as one more metrics sink: metric rows only (keys keep their ``train/`` prefixes)."""

    def __init__(self, logger: Any):
        self.logger = logger

    def log(self, metrics: dict, step: int) -> None:
        method = "log_metrics" if hasattr(self.logger, "log_metrics") else "log"
        try:
            getattr(self.logger, method)(metrics, step)
        except Exception as e:  # the user's code: its failure in one line (the step's checkpoint is written after)
            raise TrainingStopped(f"rlplane.train(logger=...): {type(self.logger).__name__}.{method} raised "
                                  f"{type(e).__name__}: {' '.join(str(e).split())[:200]} at step {step}; the run "
                                  "stopped (its checkpoints up to the step before are whole)") from None

    def log_samples(self, kind: str, step: int, rows: list[dict]) -> None:
        pass

    def close(self) -> None:
        pass


class SidePart(Protocol):
    """A recipe's own long-lived part beside the session's workers (async GRPO's collector), given to the session
    when it is made: started at the end of :meth:`Session.start`, paused around every validation, asked for the
    prompt loader's position and written into every checkpoint (``checkpoint_file``), stopped first on close."""

    checkpoint_file: str

    def start(self, s: Any, start_step: int) -> None: ...  # s: the Session

    def paused(self) -> AbstractContextManager: ...

    def loader_state(self) -> dict | None: ...  # None: the session's own loader is current

    def save(self, path: Path) -> None: ...

    def stop(self) -> None: ...
