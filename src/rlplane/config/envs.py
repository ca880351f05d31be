"""Environment settings (``env.*``): one subsection per environment, named by its ``task_name``.

A subsection's fields are passed as keyword arguments to that environment's factory, so an
environment's knobs live beside it here and nowhere else. Environments without settings need no
subsection.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rlplane.config.base import StrictModel


class MathEnvConfig(StrictModel):
    """``task_name: math``: answers checked with math-verify in a pool of verifier processes."""

    num_workers: int = Field(2, ge=1, description="Verifier processes (each scores one answer at a time).")
    timeout_s: float = Field(5.0, gt=0, description="Seconds one answer may take; a slower one scores 0.")


class ReasoningGymEnvConfig(StrictModel):
    """``task_name: reasoning_gym``: answers scored by the reasoning-gym task's own ``score_answer``."""

    timeout_s: float = Field(5.0, gt=0, description="Seconds one answer may take; a slower one scores 0.")
    num_workers: int = Field(1, ge=1, description="Scoring processes.")


class EnvConfig(StrictModel):
    """Per-environment settings; add a field named after the environment's ``task_name``."""

    math: MathEnvConfig = Field(default_factory=MathEnvConfig, description="The math-verify environment.")
    reasoning_gym: ReasoningGymEnvConfig = Field(
        default_factory=ReasoningGymEnvConfig, description="The reasoning-gym environment."
    )

    def env_kwargs(self, task_name: str) -> dict[str, Any]:
        """Keyword arguments for ``task_name``'s factory ({} when it has no subsection)."""
        section = getattr(self, task_name, None)
        return section.model_dump() if isinstance(section, StrictModel) else {}
