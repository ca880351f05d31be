"""A multi-turn game with hidden state: guess the secret in ``(0-63)`` from ``+``/``-`` feedback, reward 1.0 on
a hit. A non-number or running out of turns ends it unrewarded; the warm-up demonstration plays binary search.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from rlplane.data.datum import DatumSpec, Message, make_prompt_datum
from rlplane.envs.arithmetic import DEFAULT_END_MARKERS, extract_answer
from rlplane.envs.interface import Environment, EnvironmentReturn, last_assistant_content

TASK_NAME = "guess_number"
_NUMBER = re.compile(r"-?\d{1,6}")


def binary_search_guesses(secret: int, low: int, high: int) -> list[int]:
    """The guesses of binary search (midpoint, rounded down) until it hits ``secret``."""
    guesses = []
    while True:
        mid = (low + high) // 2
        guesses.append(mid)
        if mid == secret:
            return guesses
        low, high = (mid + 1, high) if secret > mid else (low, mid - 1)


class GuessNumberEnv(Environment):
    """Secret in ``metadata["ground_truth"]``; feedback ``+``/``-``; reward 1.0 on the hit."""

    def __init__(self, low: int = 0, high: int = 63, end_markers: Sequence[str] = DEFAULT_END_MARKERS):
        if low > high:
            raise ValueError(f"GuessNumberEnv: low = {low} > high = {high}; swap them")
        self.low, self.high, self.end_markers = low, high, tuple(end_markers)

    def prompt(self) -> str:
        return f"({self.low}-{self.high})"

    def step(self, message_logs: Sequence[list[Message]], metadata: Sequence[dict[str, Any]]) -> EnvironmentReturn:
        if len(message_logs) != len(metadata):
            raise ValueError(f"GuessNumberEnv.step: {len(message_logs)} message logs for {len(metadata)} metadata")
        observations, rewards, done, answers, new_meta = [], [], [], [], []
        for log, meta in zip(message_logs, metadata):
            secret = int(meta["ground_truth"])
            text = extract_answer(last_assistant_content(log), self.end_markers)
            guesses = int(meta.get("guesses", 0)) + 1
            new_meta.append({**meta, "guesses": guesses})
            answers.append(text)
            if not _NUMBER.fullmatch(text):
                observations.append({"role": "environment", "content": "Environment: not a number"})
                rewards.append(0.0)
                done.append(True)
                continue
            guess = int(text)
            hit = guess == secret
            observations.append({"role": "environment", "content": "=" if hit else "+" if secret > guess else "-"})
            rewards.append(1.0 if hit else 0.0)
            done.append(hit)
        return EnvironmentReturn(
            observations=observations,
            metadata=new_meta,
            next_stop_strings=[None] * len(observations),
            rewards=torch.tensor(rewards, dtype=torch.float32),
            terminateds=torch.tensor(done, dtype=torch.bool),
            answers=answers,
        )

    def demonstration(self, prompt: str, metadata: dict[str, Any]) -> list[tuple[str, str | None]]:
        """Binary search on this sample's secret: one (guess, feedback) pair per turn."""
        secret = int(metadata["ground_truth"])
        guesses = binary_search_guesses(secret, self.low, self.high)
        return [(str(g), None if g == secret else "+" if secret > g else "-") for g in guesses]


def guess_number_datums(tokenizer, num: int, *, low: int = 0, high: int = 63, seed: int = 0) -> list[DatumSpec]:
    """``num`` games with secrets drawn uniformly from ``[low, high]`` (deterministic in ``seed``)."""
    ds = GuessNumberDataset(tokenizer, num, low=low, high=high, seed=seed)
    return [ds[i] for i in range(num)]


class GuessNumberDataset:
    """``num_games`` games, item ``i`` depending only on ``(seed, i)`` (a map-style dataset)."""

    def __init__(self, tokenizer, num_games: int, *, low: int = 0, high: int = 63, seed: int = 0):
        self.tokenizer, self.num_games, self.low, self.high, self.seed = tokenizer, num_games, low, high, seed
        self.prompt = GuessNumberEnv(low, high).prompt()

    def __len__(self) -> int:
        return self.num_games

    def __getitem__(self, idx: int) -> DatumSpec:
        if not 0 <= idx < self.num_games:
            raise IndexError(idx)
        secret = int(np.random.default_rng([self.seed % 2**63, idx]).integers(self.low, self.high + 1))
        return make_prompt_datum(self.prompt, str(secret), self.tokenizer, idx=idx, task_name=TASK_NAME)
