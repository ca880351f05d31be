"""``task_name: short_answer``: a one-word or one-number answer, read where the reply ends and compared as
text (case, quotes and a final period ignored). ``"The answer is Pear."`` and ``"pear"`` both match ``pear``;
a reply without "answer is" counts by its last line's last number, else the whole line (``"There are 5."``
matches ``5``). For JSONL rows whose answers are words, which ``arithmetic`` (the whole reply, exactly) and
``math`` (math-verify reads words as symbols) do not score."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rlplane.data.datum import Message
from rlplane.envs.interface import Environment, EnvironmentReturn, last_assistant_content
from rlplane.utils.answer_spread import final_answer, normalize_answer


class ShortAnswerEnv(Environment):
    """Single-turn: 1.0 when the reply's final answer equals ``metadata["ground_truth"]`` as text, else 0.0."""

    def step(self, message_logs: Sequence[list[Message]], metadata: Sequence[dict[str, Any]]) -> EnvironmentReturn:
        if len(message_logs) != len(metadata):
            raise ValueError(f"ShortAnswerEnv.step: {len(message_logs)} message logs for {len(metadata)} metadata")
        answers = [final_answer(last_assistant_content(log)) for log in message_logs]
        scores = [float(a == normalize_answer(m["ground_truth"])) for a, m in zip(answers, metadata)]
        return EnvironmentReturn(
            observations=[{"role": "environment", "content": "Environment: correct" if s else "Environment: incorrect"}
                          for s in scores],
            metadata=list(metadata),
            next_stop_strings=[None] * len(message_logs),
            rewards=torch.tensor(scores, dtype=torch.float32),
            terminateds=torch.ones(len(message_logs), dtype=torch.bool),
            answers=answers,
        )
