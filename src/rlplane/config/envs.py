"""Environment settings (``env.*``): one subsection per environment, named by its ``task_name``.

A subsection's fields are passed as keyword arguments to that environment's factory, so an
environment's knobs live beside it here and nowhere else. Environments without settings need no
subsection.
"""

from __future__ import annotations

from typing import Any

from rlplane.config.base import StrictModel


class EnvConfig(StrictModel):
    """Per-environment settings; add a field named after the environment's ``task_name``."""

    def env_kwargs(self, task_name: str) -> dict[str, Any]:
        """Keyword arguments for ``task_name``'s factory ({} when it has no subsection)."""
        section = getattr(self, task_name, None)
        return section.model_dump() if isinstance(section, StrictModel) else {}
