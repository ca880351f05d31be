"""Prompts as ``DatumSpec`` records: procedural arithmetic, JSONL files, and a resumable loader.

Names are imported from their modules on first use: the config reads NeMo RL's dataset names from
``rlplane.data.registry`` (plain tables), and validating a config must not wait for torch or transformers,
which the loaders import.
"""

from __future__ import annotations

import importlib

_HOMES = {
    "arithmetic": ("ArithmeticDataset", "ArithmeticSpec", "build_eval_set", "is_heldout"),
    "dataloader": ("PromptDataLoader",),
    "datum": ("DatumSpec", "Message", "PromptFormat", "make_prompt_datum"),
    "errors": ("DatasetError",),
    "jsonl": ("JsonlFields", "PromptDataset", "load_jsonl_dataset", "read_jsonl_rows"),
    "tasks": ("AllTaskProcessedDataset", "TaskDataSpec"),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}
_RENAMED = {"ARITHMETIC_TASK": ("arithmetic", "TASK_NAME")}

__all__ = sorted([*_MODULE_OF, *_RENAMED])


def __getattr__(name: str):
    if name in _RENAMED:
        module, attr = _RENAMED[name]
    elif name in _MODULE_OF:
        module, attr = _MODULE_OF[name], name
    else:
        raise AttributeError(f"module 'rlplane.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rlplane.data.{module}"), attr)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
