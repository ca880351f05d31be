"""The base of every config model: strict (unknown keys are errors), immutable, documented fields."""

from __future__ import annotations

import types
import typing

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError


def _admits(annotation, kind: type) -> bool:
    """Whether ``annotation`` (``int``, ``int | None``, ``Literal[...]``, ...) takes values of ``kind`` as such."""
    if annotation is kind:
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_admits(a, kind) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return any(type(a) is kind for a in typing.get_args(annotation))
    return False


class StrictModel(BaseModel):
    """A config section: unknown keys rejected, never mutated.

    Cross-field rules are ``@model_validator(mode="after")`` methods raising ``ValueError`` with one line:
    rule, values, fix (the loader prefixes the section's dotted path).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value, info: ValidationInfo):
        # YAML's true/false would pass as 1/0 for a number (``verify_probe_every: true`` = every version).
        if isinstance(value, bool):
            annotation = cls.model_fields[info.field_name].annotation
            if not _admits(annotation, bool) and (_admits(annotation, int) or _admits(annotation, float)):
                raise PydanticCustomError("bool_for_number", "true/false where a number is expected; give a number")
        return value
