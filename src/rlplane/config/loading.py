"""A run's config: a tree read (:mod:`rlplane.config.yaml_tree`, or NeMo RL's format through
:mod:`rlplane.config.nemo`), validated into :class:`RunConfig`, every problem reported at once."""

from __future__ import annotations

import difflib
import sys
import typing
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from rlplane.config.nemo import read_nemo_config
from rlplane.config.schema import RunConfig
from rlplane.config.yaml_tree import apply_overrides, list_presets, load_yaml_tree  # noqa: F401 (re-exported)
from rlplane.errors import ConfigError  # noqa: F401 (re-exported: its older home)


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """Names of the fields valid at the section that ``loc`` points into (for 'did you mean')."""
    cls: Any = model
    for part in loc[:-1]:
        field = getattr(cls, "model_fields", {}).get(part)
        if field is None:
            extra = typing.get_type_hints(cls).get("__pydantic_extra__") if isinstance(cls, type) else None
            if extra is None:  # a section whose extra keys have a model (env.<user task>) falls through to it
                return []
        ann = field.annotation if field is not None else extra
        args = getattr(ann, "__args__", ()) or ()
        cls = next((a for a in (ann, *args) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if cls is None:
            return []
    return list(getattr(cls, "model_fields", {}))


def _merged_unions(errors: list[dict]) -> list[dict]:
    """A value that matches no member of a union (``Literal['auto'] | bool``) is one error per member, each with
    the member's tag as the last part of its path: one error here, the members' rules joined by "or"."""
    out: list[dict] = []
    by_path: dict[tuple, dict] = {}
    for e in errors:
        loc = tuple(str(p) for p in e["loc"] if not str(p).startswith("function-"))
        union = len(loc) > 1 and loc[-1] not in _fields_at(RunConfig, loc) and e["type"] != "extra_forbidden" and (
            "[" in loc[-1] or loc[-1] in ("bool", "int", "float", "str", "list", "dict", "none"))
        if not union:
            out.append({**e, "loc": loc})
            continue
        merged = by_path.get(loc[:-1])
        if merged is None:
            by_path[loc[:-1]] = merged = {**e, "loc": loc[:-1]}
            out.append(merged)
        else:
            merged["msg"] = f"{merged['msg']}, or {e['msg'].removeprefix('Input should be ')}"
    return out


def _shown(given) -> str:
    """The value a rule refused, as the user can recognise it; a mapping or list where text was due is most often
    an unquoted ``key: value`` in an override, which YAML reads as a mapping."""
    if isinstance(given, (dict, list)):
        text = repr(given)
        return f" (got {text if len(text) <= 80 else type(given).__name__})"
    return f" (got {given!r})"


def _format_errors(err: ValidationError) -> list[str]:
    problems = []
    for e in _merged_unions(err.errors()):
        loc = e["loc"]
        path = ".".join(loc) or "(top level)"
        if e["type"] == "extra_forbidden":
            valid = _fields_at(RunConfig, loc)
            close = difflib.get_close_matches(loc[-1], valid, n=1, cutoff=0.5)
            hint = (f"did you mean {'.'.join(loc[:-1] + (close[0],))}?" if close
                    else f"valid keys here: {', '.join(valid)}")
            problems.append(f"{path}: unknown key; {hint}")
            continue
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "value_error":
            # Section validators write their own lines; they already name their keys.
            section = ".".join(loc)
            problems.extend(f"{section}.{line}"
                            if section and not line.startswith(section) and "." not in line.split(" ")[0] else line
                            for line in msg.split("\n"))
            continue
        given = e.get("input")
        shown = "" if isinstance(given, dict) and e["type"] not in ("string_type", "int_type", "float_type",
                                                                    "bool_type") else _shown(given)
        if e["type"] == "string_type" and isinstance(given, dict):
            shown += "; YAML reads `a: b` as a mapping: quote the text, e.g. KEY='Q: {problem}'"
        problems.append(f"{path}: {msg}{shown}")
    return problems


def build_config(tree: dict) -> RunConfig:
    """Validate a merged tree, raising :class:`ConfigError` with every problem at once."""
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(_format_errors(err)) from None


def load_config(preset: str | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a preset (default: the embedded arithmetic job), apply overrides, validate."""
    notes: list[str] = []  # a NeMo RL file's: said once the config is valid, not above its errors
    tree = read_nemo_config(preset, overrides or [], notes)  # NeMo RL's format: read and translated (config/nemo.py)
    if tree is None:
        tree = apply_overrides(load_yaml_tree(preset or "grpo_arithmetic"), overrides or [])
    cfg = build_config(tree)
    if notes:
        print("\n".join(notes), file=sys.stderr)
    return cfg


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
