"""Exact-match scoring of arithmetic answers: reward 1.0 if the answer string matches, else 0.0."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

from rlplane.data.datum import Message
from rlplane.envs.interface import Environment, EnvironmentReturn, last_assistant_content

DEFAULT_END_MARKERS = ("<eos>",)


def extract_answer(response: str, end_markers: Sequence[str] = DEFAULT_END_MARKERS) -> str:
    """The response cut at the first end marker (the eos text, if special tokens were kept), stripped."""
    for marker in end_markers:
        cut = response.find(marker)
        if cut != -1:
            response = response[:cut]
    return response.strip()


def score_answer(response: str, ground_truth: str, end_markers: Sequence[str] = DEFAULT_END_MARKERS) -> float:
    """1.0 if the extracted answer equals ``ground_truth`` exactly (``"046"`` is not ``"46"``), else 0.0."""
    return 1.0 if extract_answer(response, end_markers) == str(ground_truth).strip() else 0.0


def score_answers(
    responses: Sequence[str], ground_truths: Sequence[str], end_markers: Sequence[str] = DEFAULT_END_MARKERS
) -> torch.Tensor:
    """Vector of ``score_answer``: (B,) float32, for evaluation loops that have plain strings."""
    if len(responses) != len(ground_truths):
        raise ValueError(f"score_answers: {len(responses)} responses for {len(ground_truths)} ground truths")
    scores = [score_answer(r, g, end_markers) for r, g in zip(responses, ground_truths)]
    return torch.tensor(scores, dtype=torch.float32)


_CANONICAL_INTEGER = re.compile(r"-?(0|[1-9][0-9]*)")


def is_canonical_integer(answer: str) -> bool:
    """True for the integers the model is taught to write: no sign on 0, no leading zeros, no spaces."""
    return answer != "-0" and _CANONICAL_INTEGER.fullmatch(answer) is not None


class ArithmeticEnv(Environment):
    """Single-turn exact match against ``metadata["ground_truth"]``; every sample terminates.

    Components for GDPO: ``correct`` (the reward) and ``format`` (a canonical integer, right or wrong).
    Answers are cut at the first of ``end_markers`` (``"<eos>"`` for the embedded tokenizer).
    """

    reward_component_names = ("correct", "format")

    def __init__(self, end_markers: Sequence[str] = DEFAULT_END_MARKERS):
        self.end_markers = tuple(end_markers)

    def step(self, message_logs: Sequence[list[Message]], metadata: Sequence[dict[str, Any]]) -> EnvironmentReturn:
        if len(message_logs) != len(metadata):
            raise ValueError(f"ArithmeticEnv.step: {len(message_logs)} message logs for {len(metadata)} metadata")
        answers = [extract_answer(last_assistant_content(log), self.end_markers) for log in message_logs]
        scores = [1.0 if a == str(m["ground_truth"]).strip() else 0.0 for a, m in zip(answers, metadata)]
        rewards = torch.tensor(scores, dtype=torch.float32)
        observations = [
            {"role": "environment", "content": "Environment: correct" if r else "Environment: incorrect"}
            for r in rewards.tolist()
        ]
        return EnvironmentReturn(
            observations=observations,
            metadata=list(metadata),
            next_stop_strings=[None] * len(message_logs),
            rewards=rewards,
            terminateds=torch.ones(len(message_logs), dtype=torch.bool),
            answers=answers,
            reward_components={
                "correct": rewards.clone(),
                "format": torch.tensor([float(is_canonical_integer(a)) for a in answers], dtype=torch.float32),
            },
        )
