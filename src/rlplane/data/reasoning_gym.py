"""reasoning-gym procedural tasks as prompt datasets (``rlplane[reasoning]``).

Problem ``i`` depends on ``(name, seed, i)``; rows carry the entry in ``extra_env_info["entry"]`` for scoring
and interleave the tasks. Training rows whose question is also held out are dropped.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from rlplane.data.errors import DatasetError

TASK_NAME = "reasoning_gym"


def _require() -> Any:
    if importlib.util.find_spec("reasoning_gym") is None:
        raise DatasetError("dataset reasoning_gym needs the reasoning-gym package: pip install 'rlplane[reasoning]'")
    import reasoning_gym

    return reasoning_gym


def reasoning_gym_rows(
    tasks: list[str], size: int, seed: int, config: dict | None = None, exclude_questions: set[str] | None = None
) -> list[dict]:
    """``size`` problems of each task as ``{"problem", "answer", "task_name", "extra_env_info"}`` rows."""
    rg = _require()
    per_task = []
    for name in tasks:
        try:
            ds = rg.create_dataset(name, size=size, seed=seed, **(config or {}))
        except Exception as e:  # unknown name, bad config keyword
            known = ""
            if "not registered" in str(e) or "Unknown" in str(e) or isinstance(e, (KeyError, ValueError)):
                known = " (see reasoning_gym.factory.DATASETS for the names)"
            raise DatasetError(f"data.reasoning_gym.tasks: {name!r}: "
                               f"{str(e).splitlines()[0] if str(e) else e!r}{known}") from None
        per_task.append([ds[i] for i in range(size)])
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
