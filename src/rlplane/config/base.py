"""The base of every config model: strict (unknown keys are errors), immutable, documented fields."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A config section: unknown keys rejected, never mutated.

    Cross-field rules are ``@model_validator(mode="after")`` methods raising ``ValueError`` with one line:
    rule, values, fix (the loader prefixes the section's dotted path).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
