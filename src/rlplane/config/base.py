"""The base of every config model: strict (unknown keys are errors), immutable, documented fields."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A config section. Unknown keys are rejected and instances are never mutated.

    Cross-field rules go in ``@model_validator(mode="after")`` methods that raise ``ValueError``
    with a one-line message stating the rule, the values and the fix, e.g.
    ``"ratio_clip_c = 0.5: dual-clip needs c > 1 (3 is usual); set it above 1 or to null"``.
    The loader prefixes the dotted path of the section, so messages need not repeat it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
