"""``task_name: math_multi_reward``: NeMo RL's three-part math reward for GDPO (``MathMultiRewardEnvironment``).

The answer is what the response holds between its last ``<answer>`` and the next ``</answer>`` (the whole
response, stripped, when it has no tags). Components, each 0 or 1:

- ``correctness``: that answer equals the ground truth as text;
- ``integer``: that answer is a run of digits;
- ``format``: the response is ``<think>...</think>\\n<answer>...</answer>`` and nothing else, one answer tag pair.

The reward is their sum (0 to 3), as NeMo RL sums a multi-reward environment's components into ``total_reward``;
GDPO normalises each component within its group (``grpo.adv_estimator.name: gdpo``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

from rlplane.data.datum import Message
from rlplane.envs.interface import Environment, EnvironmentReturn
from rlplane.envs.math_env import assistant_text

_FORMAT = re.compile(r"^<think>.*?</think>\n<answer>.*?</answer>$", re.DOTALL)


def xml_answer(text: str) -> str:
    """The text between the last ``<answer>`` and the ``</answer>`` after it (all of ``text`` without tags)."""
    return text.split("<answer>")[-1].split("</answer>")[0].strip()


def multi_reward(response: str, ground_truth: str) -> dict[str, float]:
    """The three components of one response (see the module docstring)."""
    answer = xml_answer(response)
    well_formed = bool(_FORMAT.search(response)) and response.count("<answer>") == response.count("</answer>") == 1
    return {"correctness": float(answer == ground_truth), "integer": float(answer.isdigit()),
            "format": float(well_formed)}


class MathMultiRewardEnv(Environment):
    """Single turn; every sample terminates. Components ``correctness``, ``integer``, ``format``."""

    reward_component_names = ("correctness", "integer", "format")

    def __init__(self, num_workers: int = 1, timeout_s: float = 5.0, math_verify_impl: str = "hf_math_verify"):
        del num_workers, timeout_s  # string checks: no verifier processes (env.math's keys accepted as NeMo's are)
        if math_verify_impl != "hf_math_verify":  # NeMo RL's multi-reward worker knows only this one
            raise ValueError(f"env.math_multi_reward.math_verify_impl = {math_verify_impl!r}: the multi-reward "
                             "environment has one check; set hf_math_verify")

    def step(self, message_logs: Sequence[list[Message]], metadata: Sequence[dict[str, Any]]) -> EnvironmentReturn:
        if len(message_logs) != len(metadata):
            raise ValueError(f"MathMultiRewardEnv.step: {len(message_logs)} message logs for {len(metadata)} metadata")
        parts = [multi_reward(assistant_text(log), str(m["ground_truth"])) for log, m in zip(message_logs, metadata)]
        components = {name: torch.tensor([p[name] for p in parts], dtype=torch.float32)
                      for name in self.reward_component_names}
        return EnvironmentReturn(
            observations=[{"role": "environment", "content": "Environment: correct" if p["correctness"] else
                           "Environment: incorrect"} for p in parts],
            metadata=list(metadata),
            next_stop_strings=[None] * len(message_logs),
            rewards=sum(components.values()),
            terminateds=torch.ones(len(message_logs), dtype=torch.bool),
            answers=[xml_answer(assistant_text(log)) for log in message_logs],
            reward_components=components,
        )
