"""The environment interface of the seeds (NeMo RL ``environments/interfaces.py``): ``step(message_logs,
metadata)`` scores each sample's last answer and says what to append for a next turn."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
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
    reward_components: ``{name: (B,) float32}`` parts of the reward, summed over turns, carried as
        ``reward/<name>`` (GDPO normalises each); None: none.

    Malformed entries fail their sample alone (reward 0, ``env_errors``), see ``workers/env_steps.py``.
    """

    observations: list[dict[str, str]]
    metadata: list[Any]
    next_stop_strings: list[list[str] | None]
    rewards: torch.Tensor
    terminateds: torch.Tensor
    answers: list[str | None] | None
    reward_components: dict[str, torch.Tensor] | None = None


class Environment(abc.ABC):
    """Scores model responses (plain classes); ``reward_component_names``: the components every ``step``
    returns (empty: none; GDPO needs some)."""

    reward_component_names: tuple[str, ...] = ()

    @abc.abstractmethod
    def step(self, message_logs: Sequence[list[Message]], metadata: Sequence[Any]) -> EnvironmentReturn:
        """Score the last assistant message of each log against that sample's ``metadata``."""

    def metrics(self, rewards: torch.Tensor, batch: EnvBatch | None = None) -> dict[str, float]:
        """This environment's metrics of a rollout's samples (NeMo RL's ``global_post_process_and_metrics``),
        logged as ``train/env/<task_name>/<name>``; by default :func:`default_env_metrics`."""
        return default_env_metrics(rewards, batch)


@dataclass(frozen=True)
class EnvBatch:
    """Per sample, (B,): prompt ``group``, ``truncated``, ``prompt_lengths`` and ``response_lengths`` in tokens."""

    group: torch.Tensor
    truncated: torch.Tensor
    prompt_lengths: torch.Tensor
    response_lengths: torch.Tensor


def default_env_metrics(rewards: torch.Tensor, batch: EnvBatch | None = None) -> dict[str, float]:
    """``accuracy`` = mean reward; with a ``batch`` (NeMo RL's names): ``pass@k`` = share of groups (k samples)
    with a reward > 0, ``fraction_of_samples_properly_ended`` = share not truncated, ``generation_lengths`` /
    ``prompt_lengths`` = mean tokens."""
    if not rewards.numel():
        return {"accuracy": 0.0}
    out = {"accuracy": float(rewards.float().mean())}
    if batch is None:
        return out
    groups, inverse, sizes = torch.unique(batch.group, return_inverse=True, return_counts=True)
    hit = torch.zeros(len(groups)).scatter_reduce_(0, inverse, (rewards > 0).float(), "amax")  # (G,)
    if int(sizes.min()) == int(sizes.max()):  # pass@k names one k
        out[f"pass@{int(sizes[0])}"] = float(hit.mean())
    out["fraction_of_samples_properly_ended"] = float((~batch.truncated.bool()).float().mean())
    out["generation_lengths"] = float(batch.response_lengths.double().mean())
    out["prompt_lengths"] = float(batch.prompt_lengths.double().mean())
    return out


def last_assistant_content(message_log: list[Message]) -> str:
    """The content of the last assistant message ("" if the model has not spoken)."""
    for message in reversed(message_log):
        if message.get("role") == "assistant":
            return str(message.get("content", ""))
    return ""
