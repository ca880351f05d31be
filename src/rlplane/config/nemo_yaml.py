"""Reading NeMo RL's YAML the way its OmegaConf loader does, without OmegaConf.

``defaults:`` names parent files (a path or a list, relative to the file; later ones win, the file
last; ``_override_: true`` replaces a section instead of merging it); ``${a.b}`` interpolates another
key (``${.x}`` a sibling, ``${..x}`` a parent's sibling); ``${mul:a,b}`` (also add, sub, div, max)
computes, as NeMo RL's registered resolvers; Hydra overrides may carry ``+``/``++`` or ``~`` (delete).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Callable

import yaml

from rlplane.config.yaml_limits import (
    MAX_DEFAULTS_DEPTH,
    MAX_DEFAULTS_FILES,
    MAX_INTERPOLATED_CHARS,
    MAX_INTERPOLATION_DEPTH,
    MAX_INTERPOLATION_STEPS,
    ConfigTooLarge,
    parse_config_yaml,
    read_config_text,
)
from rlplane.config.yaml_tree import apply_overrides, deep_merge
from rlplane.errors import ConfigError

NEMO_MARKERS = (
    "grpo.normalize_rewards", "grpo.use_leave_one_out_baseline", "grpo.val_start_at",
    "grpo.calculate_advantages_on_gpu", "grpo.async_grpo.recompute_kv_cache_after_weight_updates",
    "ppo.async_ppo", "ppo.calculate_advantages_on_gpu", "value_loss_fn", "value.model_name", "value.reward_model_cfg",
    "data_plane.enabled", "data_plane.impl", "data_plane.storage_capacity", "data_plane.num_storage_units",
    "policy.dtensor_cfg._v2", "policy.dtensor_cfg.tensor_parallel_size", "policy.megatron_cfg", "policy.tokenizer",
    "policy.optimizer.name", "policy.optimizer.kwargs", "policy.logprob_chunk_size",
    "policy.make_sequence_length_divisible_by",
    "data.max_input_seq_length", "data.dataset_name",
    "data.default", "logger.monitor_gpus", "logger.gpu_monitoring", "logger.swanlab_enabled",
    "checkpointing.model_save_format", "checkpointing.checkpoint_must_save_by", "cluster.master_port_range_low",
    "reward_penalties",
)
_RESOLVERS: dict[str, Callable[[Any, Any], Any]] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
    "max": lambda a, b: max(a, b),
}
_INTERP = re.compile(r"\$\{([^${}]*)\}")  # an innermost ${...}: no nested ${ inside




def _read(path: Path) -> dict:
    # Duplicate keys are refused as OmegaConf's loader refuses them.
    tree = parse_config_yaml(read_config_text(path), str(path)) or {}
    if not isinstance(tree, dict):
        raise ConfigError([f"config {path}: the top level must be a mapping, got {type(tree).__name__}"])
    return _unshared(tree)


def _unshared(node: Any) -> Any:
    """A copy in which no two keys share a dict or list: YAML anchors (``<<: *BASE``) alias them, so an
    override of ``policy.x`` would otherwise change ``teacher.x`` too."""
    if isinstance(node, dict):
        return {k: _unshared(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_unshared(v) for v in node]
    return node


def _merge(base: dict, top: dict) -> dict:
    """NeMo RL's merge: ``_override_: true`` in a section of ``top`` replaces that section of ``base``."""
    base, top = dict(base), dict(top)
    for key, value in top.items():
        if isinstance(value, dict) and value.get("_override_"):
            top[key] = {k: v for k, v in value.items() if k != "_override_"}
            base.pop(key, None)
    return deep_merge(base, top)


def load_nemo_chain(path: Path, _seen: tuple[Path, ...] = (), _read_files: list | None = None) -> dict | None:
    """The file merged over its ``defaults:`` files (later ones win, the file last); None when a
    ``defaults`` entry is not a file (an rlplane preset name: not NeMo RL's format)."""
    path = path.resolve()
    if path in _seen:
        raise ConfigError([f"config {path}: `defaults` forms a cycle ({' -> '.join(map(str, _seen))})"])
    _read_files = [] if _read_files is None else _read_files
    _read_files.append(path)
    if len(_seen) >= MAX_DEFAULTS_DEPTH:
        raise ConfigTooLarge([f"config {_seen[0]}: its `defaults` chain is longer than {MAX_DEFAULTS_DEPTH} files, "
                              f"over MAX_DEFAULTS_DEPTH = {MAX_DEFAULTS_DEPTH}; extend fewer files"])
    if len(_read_files) > MAX_DEFAULTS_FILES:
        root = _seen[0] if _seen else path
        raise ConfigTooLarge([f"config {root}: its `defaults` read more than {MAX_DEFAULTS_FILES} files, over "
                              f"MAX_DEFAULTS_FILES = {MAX_DEFAULTS_FILES}; name each parent once"])
    tree = _read(path)
    parents = tree.pop("defaults", None)
    if not parents:
        return tree
    base: dict = {}
    for name in [parents] if isinstance(parents, str) else list(parents):
        parent = Path(str(name)) if str(name).startswith("/") else path.parent / str(name)
        if not parent.is_file():
            return None
        sub = load_nemo_chain(parent, _seen + (path,), _read_files)
        if sub is None:
            return None
        base = _merge(base, sub)
    return _merge(base, tree)


def _paths(tree: Any, prefix: str = "") -> list[str]:
    if not isinstance(tree, dict):
        return [prefix]
    return [p for k, v in tree.items() for p in _paths(v, f"{prefix}{k}.")] or [prefix]


def looks_like_nemo(tree: dict) -> bool:
    """A key only NeMo RL has, or a ``${...}`` interpolation anywhere."""
    keys = [p.rstrip(".") for p in _paths(tree)]
    if any(k == m or k.startswith(m + ".") for k in keys for m in NEMO_MARKERS):
        return True
    return "${" in yaml.safe_dump(tree) or isinstance(get_key(tree, "policy.scheduler"), list)


def get_key(tree: dict, key: str, default: Any = None) -> Any:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def apply_hydra_overrides(tree: dict, overrides: list[str]) -> dict:
    """``key=value``, ``+key=value``, ``++key=value`` set a key; ``~key`` deletes it."""
    tree = copy.deepcopy(tree)
    plain = []
    for item in overrides:
        if item.startswith("~"):
            *parents, last = item[1:].split("=", 1)[0].split(".")
            node = get_key(tree, ".".join(parents)) if parents else tree
            if isinstance(node, dict):
                node.pop(last, None)
        else:
            plain.append(item.lstrip("+"))
    return apply_overrides(tree, plain)


def _resolver_argument(text: str, expr: str, where: str) -> int | float:
    try:
        value = yaml.safe_load(text.strip())
    except (yaml.YAMLError, ValueError):  # ValueError: an integer of more digits than Python converts
        value = None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ConfigError([f"{where}: ${{{expr}}}: {text.strip()!r} is not a number; NeMo RL's resolvers take two "
                           "numbers, e.g. ${mul:${grpo.num_prompts_per_step},2}"])
    return value


def _resolve(name: str, args: str, expr: str, where: str) -> int | float:
    """NeMo RL's arithmetic resolvers on two numbers; a result too large for a config is refused."""
    if args.count(",") != 1:
        raise ConfigError([f"{where}: ${{{expr}}}: {name} takes two numbers, e.g. ${{{name}:2,3}}"])
    a, b = (_resolver_argument(x, expr, where) for x in args.split(","))
    try:
        value = _RESOLVERS[name](a, b)
    except (ArithmeticError, ValueError) as e:
        raise ConfigError([f"{where}: ${{{expr}}}: cannot compute it ({e}); fix the numbers"]) from None
    if isinstance(value, int) and abs(value) >= 2**64:
        raise ConfigError([f"{where}: ${{{expr}}}: {name} gives a number beyond any setting (2**64 or more); fix "
                           "the numbers"])
    return value


def resolve_interpolations(tree: dict) -> dict:
    """Every ``${...}`` replaced by its value (a whole-string interpolation keeps the value's type), in a number
    of steps (values copied, ``${...}`` evaluated) and a chain of references that are both bounded."""
    out = copy.deepcopy(tree)
    resolving: list[str] = []
    steps = [0]

    def step(where: list[str]) -> None:
        steps[0] += 1
        if steps[0] > MAX_INTERPOLATION_STEPS:
            raise ConfigTooLarge([f"{'.'.join(where) or '(top level)'}: resolving the config's ${{...}} takes more "
                                  f"than {MAX_INTERPOLATION_STEPS:,} steps, over MAX_INTERPOLATION_STEPS = "
                                  f"{MAX_INTERPOLATION_STEPS:,}; a reference is multiplied many times: reference "
                                  "the sections once"])

    def lookup(ref: str, where: list[str]) -> Any:
        if ref.startswith("."):
            dots = len(ref) - len(ref.lstrip("."))
            base = where[:-1][: len(where) - dots] if dots > 1 else where[:-1]
            ref = ".".join([*base, ref[dots:]])
        node: Any = out
        for part in ref.split("."):
            if not isinstance(node, dict) or part not in node:
                raise ConfigError([f"{'.'.join(where)}: interpolation ${{{ref}}} names no key; fix the reference"])
            node = node[part]
        return value_of(node, ref.split("."))

    def evaluate(expr: str, where: list[str]) -> Any:
        step(where)
        name, colon, args = expr.partition(":")
        if colon and name in _RESOLVERS:
            return _resolve(name, args, expr, ".".join(where))
        if colon:
            raise ConfigError([f"{'.'.join(where)}: ${{{expr}}}: unknown resolver {name!r}; "
                               f"known: {', '.join(_RESOLVERS)}"])
        return lookup(expr.strip(), where)

    def value_of(node: Any, where: list[str]) -> Any:
        step(where)
        if isinstance(node, dict):
            return {k: value_of(v, [*where, k]) for k, v in node.items()}
        if isinstance(node, list):
            return [value_of(v, where) for v in node]
        if not isinstance(node, str) or "${" not in node:
            return node
        key = ".".join(where)
        if key in resolving:
            raise ConfigError([f"{key}: interpolation cycle ({' -> '.join([*resolving, key])}); break it"])
        if len(resolving) >= MAX_INTERPOLATION_DEPTH:
            raise ConfigTooLarge([f"{key}: interpolations reference one another more than {MAX_INTERPOLATION_DEPTH} "
                                  f"deep ({resolving[0]} -> ... -> {key}), over MAX_INTERPOLATION_DEPTH = "
                                  f"{MAX_INTERPOLATION_DEPTH}; reference the value itself"])
        resolving.append(key)
        try:
            text = node
            while (m := _INTERP.search(text)) is not None:
                value = evaluate(m.group(1), where)
                if m.span() == (0, len(text)):
                    return value
                text = text[: m.start()] + str(value) + text[m.end():]
                if len(text) > MAX_INTERPOLATED_CHARS:
                    raise ConfigTooLarge([f"{key}: its ${{...}} substitutions build a string of more than "
                                          f"{MAX_INTERPOLATED_CHARS:,} characters, over MAX_INTERPOLATED_CHARS = "
                                          f"{MAX_INTERPOLATED_CHARS:,}; reference shorter values"])
            return text
        finally:
            resolving.pop()

    return value_of(out, [])
