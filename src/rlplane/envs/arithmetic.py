"""Exact-match scoring of arithmetic answers: reward 1.0 if the answer string matches, else 0.0."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rlplane.data.datum import Message
from rlplane.envs.interface import Environment, EnvironmentReturn, last_assistant_content

DEFAULT_END_MARKERS = ("<eos>",)


def extract_answer(response: str, end_markers: Sequence[str] = DEFAULT_END_MARKERS) -> str:
    """The response cut at the first end marker (the eos token's text, when decoded with special
    tokens kept), with surrounding whitespace stripped."""
    for marker in end_markers:
        cut = response.find(marker)
        if cut != -1:
            response = response[:cut]
    return response.strip()


def score_answer(response: str, ground_truth: str, end_markers: Sequence[str] = DEFAULT_END_MARKERS) -> float:
    """1.0 if the extracted answer equals ``ground_truth`` (both stripped) exactly, else 0.0.

    Exact string match: ``"046"`` does not match ``"46"``, as the model is taught canonical integers.
    """
    return 1.0 if extract_answer(response, end_markers) == str(ground_truth).strip() else 0.0


def score_answers(
    responses: Sequence[str], ground_truths: Sequence[str], end_markers: Sequence[str] = DEFAULT_END_MARKERS
) -> torch.Tensor:
    """Vector of ``score_answer``: (B,) float32, for evaluation loops that have plain strings."""
    if len(responses) != len(ground_truths):
        raise ValueError(f"score_answers: {len(responses)} responses for {len(ground_truths)} ground truths")
    scores = [score_answer(r, g, end_markers) for r, g in zip(responses, ground_truths)]
    return torch.tensor(scores, dtype=torch.float32)


class ArithmeticEnv(Environment):
    """Single-turn exact match against ``metadata["ground_truth"]``; every sample terminates.

    The assistant content may be decoded with ``skip_special_tokens=True`` (nothing to cut) or with
    special tokens kept, in which case it is cut at the first of ``end_markers`` (the eos text:
    ``"<eos>"`` for the embedded tokenizer; pass e.g. ``("<|im_end|>",)`` for other tokenizers).
    """

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
        )
