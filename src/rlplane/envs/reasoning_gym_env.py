"""``task_name: reasoning_gym``: answers scored by the reasoning-gym task's own ``score_answer`` (partial
credit unless ``partial_credit`` is false), in a verifier pool with a deadline. Needs ``rlplane[reasoning]``."""

from __future__ import annotations

from typing import Any

from rlplane.envs.math_env import PooledVerifierEnv


class ReasoningGymEnv(PooledVerifierEnv):
    verify_fn = "rlplane.verifiers.reasoning_gym_answer:score_reasoning_gym_answer"
    requires = ("reasoning_gym", "reasoning")

    def __init__(
        self, num_workers: int = 1, timeout_s: float = 5.0, verify_fn: str | None = None, partial_credit: bool = True,
        answer_format: str = "any",
    ):
        super().__init__(num_workers=num_workers, timeout_s=timeout_s, verify_fn=verify_fn)
        self.partial_credit = partial_credit
        self.answer_format = answer_format

    def verifier_args(self, response: str, metadata: dict[str, Any]) -> tuple:
        return (response, metadata["entry"], self.partial_credit, self.answer_format)
