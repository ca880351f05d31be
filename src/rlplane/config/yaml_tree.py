"""Reading config trees: presets and YAML files with ``defaults:`` inheritance (child wins), dotted overrides.

``defaults: NAME`` names a preset or a path relative to the file; override values parse as YAML.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path

import yaml

from rlplane.errors import ConfigError

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


def deep_merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in top.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
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
        tree = deep_merge(load_yaml_tree(parent, _seen + (path,)), tree)
    return tree


def apply_overrides(tree: dict, overrides: list[str]) -> dict:
    """Apply ``a.b.c=value`` strings to a nested dict (returns a new dict)."""
    out = deep_merge({}, tree)
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
