"""YAML presets with inheritance, dotted command-line overrides, and errors reported all at once.

A preset is a YAML mapping; ``defaults: NAME`` (a preset name or a path relative to the file)
names the preset it extends, merged key by key. Overrides look like ``grpo.num_prompts_per_step=16``;
the value is parsed as YAML (``true``, ``1e-4``, ``[a, b]``, ``null``).
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from rlplane.config.schema import RunConfig
from rlplane.errors import ConfigError  # noqa: F401 (re-exported: its older home)

PRESET_DIR = Path(__file__).resolve().parent.parent / "configs"


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def _resolve_preset(name: str, relative_to: Path | None = None) -> Path:
    candidates = [Path(name)]
    if relative_to is not None:
        candidates.insert(0, relative_to / name)
    candidates.append(PRESET_DIR / (name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"))
    for c in candidates:
        if c.is_file():
            return c
    raise ConfigError(
        [f"config {name!r}: no such file or preset; presets are {', '.join(list_presets())}, or give a YAML path"]
    )


def _deep_merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in top.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load, but a key given twice in one mapping is an error (YAML would keep the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                continue  # SafeLoader reports an unhashable key itself
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_yaml_tree(name: str, _seen: tuple[Path, ...] = ()) -> dict:
    """Read a preset or YAML file and everything it extends, merged (child wins)."""
    path = _resolve_preset(name, _seen[-1].parent if _seen else None).resolve()
    if path in _seen:
        raise ConfigError([f"config {path}: `defaults` forms a cycle ({' -> '.join(str(p) for p in _seen)})"])
    try:
        tree = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader) or {}
    except UnicodeDecodeError as e:
        raise ConfigError([f"config {path}: not UTF-8 text (byte {e.start}); save it as UTF-8"]) from None
    except OSError as e:
        raise ConfigError([f"config {path}: cannot read it ({e.strerror or type(e).__name__})"]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError([f"config {where}: not valid YAML ({getattr(e, 'problem', e)}); fix the syntax"]) from None
    if not isinstance(tree, dict):
        raise ConfigError([f"config {path}: the top level must be a mapping of sections, got {type(tree).__name__}"])
    parent = tree.pop("defaults", None)
    if parent:
        tree = _deep_merge(load_yaml_tree(parent, _seen + (path,)), tree)
    return tree


def apply_overrides(tree: dict, overrides: list[str]) -> dict:
    """Apply ``a.b.c=value`` strings to a nested dict (returns a new dict)."""
    out = _deep_merge({}, tree)
    for item in overrides:
        if "=" not in item:
            raise ConfigError([f"override {item!r}: expected KEY=VALUE, e.g. grpo.num_prompts_per_step=16"])
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        if isinstance(value, str):  # YAML 1.1 reads `1e-4` as a string; users mean a number
            try:
                value = float(value)
            except ValueError:
                pass
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            child = node.get(p)
            if not isinstance(child, dict):
                child = {}
                node[p] = child
            node = child
        node[parts[-1]] = value
    return out


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


def _format_errors(err: ValidationError) -> list[str]:
    problems = []
    for e in err.errors():
        loc = tuple(str(p) for p in e["loc"] if not str(p).startswith("function-"))
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
        shown = "" if isinstance(given, dict) else f" (got {given!r})"
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
    from rlplane.config.nemo import read_nemo_config

    tree = read_nemo_config(preset, overrides or [])  # NeMo RL's format: read and translated (config/nemo.py)
    if tree is None:
        tree = apply_overrides(load_yaml_tree(preset or "grpo_arithmetic"), overrides or [])
    return build_config(tree)


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
