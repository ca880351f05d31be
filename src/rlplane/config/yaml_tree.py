"""Reading config trees: presets and YAML files with ``defaults:`` inheritance (child wins), dotted overrides.

``defaults: NAME`` names a preset or a path relative to the file; override values parse as YAML.
"""

from __future__ import annotations

from pathlib import Path

from rlplane.config.yaml_limits import (
    MAX_CONFIG_DEPTH,
    MAX_DEFAULTS_DEPTH,
    ConfigTooLarge,
    parse_config_yaml,
    read_config_text,
)
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


def load_yaml_tree(name: str, _seen: tuple[Path, ...] = ()) -> dict:
    """Read a preset or YAML file and everything it extends, merged (child wins)."""
    path = _resolve_preset(name, _seen[-1].parent if _seen else None).resolve()
    if path in _seen:
        raise ConfigError([f"config {path}: `defaults` forms a cycle ({' -> '.join(str(p) for p in _seen)})"])
    if len(_seen) >= MAX_DEFAULTS_DEPTH:
        raise ConfigTooLarge([f"config {_seen[0]}: its `defaults` chain is longer than {MAX_DEFAULTS_DEPTH} files, "
                              f"over MAX_DEFAULTS_DEPTH = {MAX_DEFAULTS_DEPTH}; extend fewer files"])
    tree = parse_config_yaml(read_config_text(path), str(path)) or {}
    if not isinstance(tree, dict):
        raise ConfigError([f"config {path}: the top level must be a mapping of sections, got {type(tree).__name__}"])
    parent = tree.pop("defaults", None)
    if parent:
        if not isinstance(parent, str):
            raise ConfigError([f"config {path}: defaults = {parent!r}: name one preset or YAML file"])
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
            value = parse_config_yaml(raw, f"override {key}") if raw != "" else ""
        except ConfigTooLarge:
            raise
        except ConfigError:
            value = raw
        if isinstance(value, str):  # YAML 1.1 reads `1e-4` as a string; users mean a number
            try:
                value = float(value)
            except ValueError:
                pass
        node = out
        parts = key.strip().split(".")
        if len(parts) > MAX_CONFIG_DEPTH:
            raise ConfigTooLarge([f"override {key[:60]}...: {len(parts)} levels deep, over MAX_CONFIG_DEPTH = "
                                  f"{MAX_CONFIG_DEPTH}; name a key of the config"])
        for p in parts[:-1]:
            child = node.get(p)
            if not isinstance(child, dict):
                child = {}
                node[p] = child
            node = child
        node[parts[-1]] = value
    return out
