"""``task_name: math``: free-form answers checked with math-verify (NeMo RL's ``MathEnvironment``), in a
verifier process pool with a per-answer deadline (a hang scores 0). Needs ``rlplane[math]``."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

import torch

from rlplane.data.datum import Message
from rlplane.envs.interface import Environment, EnvironmentReturn

VERIFY_FN = "rlplane.verifiers.math_answer:verify_math_answer"
VERIFY_FNS = {"hf_math_verify": VERIFY_FN, "dapo_math_verify": "rlplane.verifiers.dapo_answer:verify_dapo_answer"}


def assistant_text(message_log: list[Message]) -> str:
    """Every assistant message's content, concatenated (the whole answer of a multi-turn sample)."""
    return "".join(str(m.get("content", "")) for m in message_log if m.get("role") == "assistant")


class PooledVerifierEnv(Environment):
    """Single-turn scoring by ``verify_fn(response, ...) -> (score, answer)`` in a process pool (errors and
    timeouts score 0); subclasses give each sample's :meth:`verifier_args`."""

    verify_fn: str
    requires: tuple[str, str] | None = None  # (module, pip extra) checked at construction

    def __init__(self, num_workers: int = 2, timeout_s: float = 5.0, verify_fn: str | None = None):
        from rlplane.verifiers.pool import VerifierPool

        if self.requires and importlib.util.find_spec(self.requires[0]) is None:
            raise ModuleNotFoundError(
                f"{type(self).__name__} needs the {self.requires[0]!r} package: pip install "
                f"'rlplane[{self.requires[1]}]'"
            )
        self.pool = VerifierPool(verify_fn or self.verify_fn, num_workers=num_workers, timeout_s=timeout_s)

    def verifier_args(self, response: str, metadata: dict[str, Any]) -> tuple:
        raise NotImplementedError

    def step(self, message_logs: Sequence[list[Message]], metadata: Sequence[dict[str, Any]]) -> EnvironmentReturn:
        if len(message_logs) != len(metadata):
            raise ValueError(f"{type(self).__name__}.step: {len(message_logs)} "
                             f"message logs for {len(metadata)} metadata")
        results = self.pool.map([self.verifier_args(assistant_text(log), m) for log, m in zip(message_logs, metadata)])
        scores = [float(r[0]) if r is not None else 0.0 for r in results]
        answers = [r[1] if r is not None else None for r in results]
        rewards = torch.tensor(scores, dtype=torch.float32)
        return EnvironmentReturn(
            observations=[
                {"role": "environment", "content": "Environment: correct" if s else "Environment: incorrect"}
                for s in scores
            ],
            metadata=list(metadata),
            next_stop_strings=[None] * len(message_logs),
            rewards=rewards,
            terminateds=torch.ones(len(message_logs), dtype=torch.bool),
            answers=answers,
        )

    def close(self) -> None:
        self.pool.close()


class MathEnv(PooledVerifierEnv):
    """Math answers against ``metadata["ground_truth"]`` with math-verify (see the module docstring), or with DAPO's
    rule (``math_verify_impl: dapo_math_verify``, NeMo RL's key)."""

    verify_fn = VERIFY_FN
    requires = ("math_verify", "math")

    def __init__(self, num_workers: int = 2, timeout_s: float = 5.0, verify_fn: str | None = None,
                 math_verify_impl: str = "hf_math_verify"):
        if math_verify_impl not in VERIFY_FNS:
            raise ValueError(f"math_verify_impl = {math_verify_impl!r}: one of {', '.join(VERIFY_FNS)}")
        if math_verify_impl != "hf_math_verify":
            self.requires = None  # DAPO's rule is plain string work
        super().__init__(num_workers, timeout_s, verify_fn or VERIFY_FNS[math_verify_impl])

    def verifier_args(self, response: str, metadata: dict[str, Any]) -> tuple:
        return (response, str(metadata["ground_truth"]))
