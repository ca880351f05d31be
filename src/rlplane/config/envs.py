"""Environment settings (``env.*``): one subsection per environment, named by its ``task_name``.

A subsection's fields are passed as keyword arguments to that environment's factory, so an
environment's knobs live beside it here and nowhere else. Environments without settings need no
subsection.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from rlplane.config.base import StrictModel


class MathEnvConfig(StrictModel):
    """``task_name: math``: answers checked with math-verify in a pool of verifier processes."""

    num_workers: int = Field(2, ge=1, description="Verifier processes (each scores one answer at a time).")
    timeout_s: float = Field(5.0, gt=0, description="Seconds one answer may take; a slower one scores 0.")


class ReasoningGymEnvConfig(StrictModel):
    """``task_name: reasoning_gym``: answers scored by the reasoning-gym task's own ``score_answer``."""

    timeout_s: float = Field(5.0, gt=0, description="Seconds one answer may take; a slower one scores 0.")
    num_workers: int = Field(1, ge=1, description="Scoring processes.")
class CalculatorEnvConfig(StrictModel):
    """The calculator tool (``rlplane.envs.calculator``)."""

    max_tool_calls: int = Field(1, ge=0, description="Tool calls per sample before every response counts as the answer.")


class CodeEnvConfig(StrictModel):
    """Python run against tests in the sandbox (``rlplane.envs.code``, ``rlplane.envs.sandbox``)."""

    cpu_seconds: float = Field(2.0, gt=0, description="CPU time per program (RLIMIT_CPU).")
    wall_seconds: float = Field(5.0, gt=0, description="Elapsed time per program before it is killed.")
    memory_mb: int = Field(512, ge=64, description="Address space per program (RLIMIT_AS), MiB.")
    output_kb: int = Field(64, ge=1, description="stdout and stderr each, KiB (longer output kills the program).")
    num_workers: int = Field(2, ge=1, description="Programs run at once.")
    max_attempts: int = Field(1, ge=1, description="Attempts per sample (> 1: the error is fed back; needs max_rollout_turns).")


class GuessNumberEnvConfig(StrictModel):
    """The number-guessing game (``rlplane.envs.guess_number``)."""

    low: int = Field(0, ge=0, description="Smallest secret.")
    high: int = Field(63, ge=0, description="Largest secret.")

    @model_validator(mode="after")
    def _range(self) -> "GuessNumberEnvConfig":
        if self.low > self.high:
            raise ValueError(f"low = {self.low} > high = {self.high}; swap them")
        return self


class EnvConfig(StrictModel):
    """Per-environment settings; add a field named after the environment's ``task_name``."""

    math: MathEnvConfig = Field(default_factory=MathEnvConfig, description="The math-verify environment.")
    reasoning_gym: ReasoningGymEnvConfig = Field(
        default_factory=ReasoningGymEnvConfig, description="The reasoning-gym environment."
    )
    calculator: CalculatorEnvConfig = Field(default_factory=CalculatorEnvConfig, description="Calculator tool.")
    code: CodeEnvConfig = Field(default_factory=CodeEnvConfig, description="Code execution in the sandbox.")
    guess_number: GuessNumberEnvConfig = Field(default_factory=GuessNumberEnvConfig, description="Guessing game.")

    def env_kwargs(self, task_name: str) -> dict[str, Any]:
        """Keyword arguments for ``task_name``'s factory ({} when it has no subsection)."""
        section = getattr(self, task_name, None)
        return section.model_dump() if isinstance(section, StrictModel) else {}
