"""reasoning-gym procedural tasks as prompt datasets (``rlplane[reasoning]``).

Problem ``i`` depends on ``(name, seed, i)``; rows carry the entry in ``extra_env_info["entry"]`` for scoring
and interleave the tasks. Training rows whose question is also held out are dropped.
"""

from __future__ import annotations

import enum
import importlib.util
import typing
from typing import Any

from rlplane.data.errors import DatasetError

TASK_NAME = "reasoning_gym"


def _require() -> Any:
    if importlib.util.find_spec("reasoning_gym") is None:
        raise DatasetError("dataset reasoning_gym needs the reasoning-gym package: pip install 'rlplane[reasoning]'")
    import reasoning_gym

    return reasoning_gym


def _enum_of(hint: Any) -> type[enum.Enum] | None:
    """The Enum class behind ``E`` or ``list[E]``, else None."""
    for t in (hint, *typing.get_args(hint)):
        if isinstance(t, type) and issubclass(t, enum.Enum):
            return t
    return None


def _member(name: str, key: str, kind: type[enum.Enum], value: Any) -> Any:
    """``value`` as a member of ``kind`` when it is a string naming one (by value or name, any case)."""
    if not isinstance(value, str):
        return value
    for m in kind:
        if value.lower() in (str(m.value).lower(), m.name.lower()):
            return m
    raise DatasetError(f"data.reasoning_gym.config.{key}: {value!r} is not one of {name}'s "
                       f"{', '.join(str(m.value) for m in kind)}; write one of them")


def _typed_config(name: str, config: dict | None) -> dict:
    """``config`` with strings turned into the task's Enum members where its config field is an Enum (or a list of
    them): YAML writes ``task_types: [siblings]`` for aiw's ``[TaskType.SIBLINGS]``."""
    from reasoning_gym.factory import DATASETS

    config = dict(config or {})
    if name not in DATASETS:  # reported by create_dataset
        return config
    try:
        hints = typing.get_type_hints(DATASETS[name][1])
    except Exception:  # an annotation that does not resolve: pass the config on untouched
        return config
    for key, value in config.items():
        kind = _enum_of(hints.get(key))
        if kind is not None:
            config[key] = ([_member(name, key, kind, v) for v in value] if isinstance(value, (list, tuple))
                           else _member(name, key, kind, value))
    return config


def reasoning_gym_rows(
    tasks: list[str], size: int, seed: int, config: dict | None = None, exclude_questions: set[str] | None = None
) -> list[dict]:
    """``size`` problems of each task as ``{"problem", "answer", "task_name", "extra_env_info"}`` rows."""
    rg = _require()
    per_task = []
    for name in tasks:
        kwargs = _typed_config(name, config)
        try:
            ds = rg.create_dataset(name, size=size, seed=seed, **kwargs)
        except Exception as e:  # unknown name, bad config keyword
            known = ""
            if "not registered" in str(e) or "Unknown" in str(e) or isinstance(e, (KeyError, ValueError)):
                known = " (see reasoning_gym.factory.DATASETS for the names)"
            raise DatasetError(f"data.reasoning_gym.tasks: {name!r}: "
                               f"{str(e).splitlines()[0] if str(e) else e!r}{known}") from None
        try:
            per_task.append([ds[i] for i in range(size)])
        except Exception as e:  # a config the task accepted but cannot generate from
            raise DatasetError(f"data.reasoning_gym: {name} could not make its problems from data.reasoning_gym.config "
                               f"{config or {}}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; check "
                               f"the config against {type(ds.config).__name__} in reasoning_gym") from None
    rows = []
    exclude = exclude_questions or set()
    for i in range(size):
        for entry in (t[i] for t in per_task):
            if entry["question"] in exclude:
                continue
            rows.append({
                "problem": entry["question"],
                "answer": str(entry["answer"]),
                "task_name": TASK_NAME,
                "extra_env_info": {"entry": {"question": entry["question"], "answer": entry["answer"],
                                             "metadata": entry["metadata"]}},
            })
    if exclude and not rows:
        raise DatasetError(f"data.reasoning_gym: all {size * len(tasks)} training problems of {', '.join(tasks)} are "
                           "held-out questions too (the task's config allows few distinct questions); widen "
                           "data.reasoning_gym.config or lower data.reasoning_gym.val_size")
    return rows
