"""The environment interface of the seeds (NeMo RL ``environments/interfaces.py``).

An environment scores a batch of conversations: ``step(message_logs, metadata)`` gets each
sample's message log (the last message is the model's answer) and its ``extra_env_info``, and
returns rewards, whether each sample is finished, and what to append for a next turn.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from rlplane.data.datum import Message


class EnvironmentReturn(NamedTuple):
    """One entry per sample, in input order.

    observations: the message to append next, ``{"role": "environment", "content": ...}``.
    metadata: the per-sample state for the next turn.
    next_stop_strings: extra stop strings for the next turn (None: none).
    rewards: (B,) float32.
    terminateds: (B,) bool; True ends the sample's rollout.
    answers: what the environment extracted from each response (None where nothing), or None.
    reward_components: optional named parts of the reward, ``{name: (B,) float32}`` (e.g. correctness
        and format), summed over turns like ``rewards`` and carried as ``reward/<name>``; GDPO
        (``grpo.adv_estimator.name: gdpo``) normalises each separately. None: the env has none.

    The rollout checks every return (``workers/turns.py``): lists of the wrong length make it
    step the batch's samples one by one; a sample whose own entry is malformed (an observation
    that is neither a dict nor None, a non-finite reward, stop strings that are not a list of
    strings) fails alone: reward 0, counted in ``env_errors``, with a warning in the log.
    """

    observations: list[dict[str, str]]
    metadata: list[Any]
    next_stop_strings: list[list[str] | None]
    rewards: torch.Tensor
    terminateds: torch.Tensor
    answers: list[str | None] | None
    reward_components: dict[str, torch.Tensor] | None = None


class Environment(abc.ABC):
    """Scores model responses. Implementations are plain classes (a Ray wrapper may host them).

    ``reward_component_names``: the names of the ``reward_components`` every ``step`` returns
    (empty: none). Config checks read it to refuse GDPO with an environment that has none.
    """

    reward_component_names: tuple[str, ...] = ()

    @abc.abstractmethod
    def step(self, message_logs: Sequence[list[Message]], metadata: Sequence[Any]) -> EnvironmentReturn:
        """Score the last assistant message of each log against that sample's ``metadata``."""

    def metrics(self, rewards: torch.Tensor) -> dict[str, float]:
        """Per-batch summary metrics (overridable); by default the mean reward as ``accuracy``."""
        return {"accuracy": float(rewards.float().mean()) if rewards.numel() else 0.0}


def last_assistant_content(message_log: list[Message]) -> str:
    """The content of the last assistant message ("" if the model has not spoken)."""
    for message in reversed(message_log):
        if message.get("role") == "assistant":
            return str(message.get("content", ""))
    return ""
