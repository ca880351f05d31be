"""Tool use: the model calls a calculator, ``(12*34)``, reads ``=408 `` back, then answers.

A response that is not a call (or any after ``max_tool_calls``) is the answer, exact-matched against
``ground_truth`` for reward 1.0. The tags use characters the embedded tokenizer has.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

from rlplane.data.datum import Message
from rlplane.envs.arithmetic import DEFAULT_END_MARKERS, extract_answer
from rlplane.envs.interface import Environment, EnvironmentReturn, last_assistant_content

_CALL = re.compile(r"\(\s*(-?\d{1,6})\s*([+\-*])\s*(-?\d{1,6})\s*\)")


def parse_call(response: str) -> tuple[int, str, int] | None:
    """``(a op b)`` as ``(a, op, b)`` when the response is exactly one call, else None."""
    m = _CALL.fullmatch(response.strip())
    return (int(m.group(1)), m.group(2), int(m.group(3))) if m else None


def evaluate_call(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


class CalculatorEnv(Environment):
    """A calculator tool and an exact-match final answer (see the module docstring)."""

    def __init__(self, max_tool_calls: int = 1, end_markers: Sequence[str] = DEFAULT_END_MARKERS):
        self.max_tool_calls = max_tool_calls
        self.end_markers = tuple(end_markers)

    def step(self, message_logs: Sequence[list[Message]], metadata: Sequence[dict[str, Any]]) -> EnvironmentReturn:
        if len(message_logs) != len(metadata):
            raise ValueError(f"CalculatorEnv.step: {len(message_logs)} message logs for {len(metadata)} metadata")
        observations, new_meta, rewards, done, answers = [], [], [], [], []
        for log, meta in zip(message_logs, metadata):
            text = extract_answer(last_assistant_content(log), self.end_markers)
            calls = int(meta.get("tool_calls", 0))
            call = parse_call(text) if calls < self.max_tool_calls else None
            if call is not None:
                observations.append({"role": "tool", "content": f"={evaluate_call(*call)} "})
                new_meta.append({**meta, "tool_calls": calls + 1})
                rewards.append(0.0)
                done.append(False)
                answers.append(None)
                continue
            correct = text == str(meta["ground_truth"]).strip()
            observations.append({"role": "environment", "content": "Environment: correct" if correct else
                                 "Environment: incorrect"})
            new_meta.append({**meta, "tool_calls": calls})
            rewards.append(1.0 if correct else 0.0)
            done.append(True)
            answers.append(text)
        return EnvironmentReturn(
            observations=observations,
            metadata=new_meta,
            next_stop_strings=[None] * len(observations),
            rewards=torch.tensor(rewards, dtype=torch.float32),
            terminateds=torch.tensor(done, dtype=torch.bool),
            answers=answers,
        )

    def demonstration(self, prompt: str, metadata: dict[str, Any]) -> list[tuple[str, str | None]] | None:
        """The ideal conversation for a ``"12*34="`` prompt: call the tool, then copy its result."""
        expression = prompt.strip().rstrip("=")
        call = parse_call(f"({expression})")
        if call is None:
            return None
        result = str(evaluate_call(*call))
        return [(f"({expression})", f"={result} "), (result, None)]
