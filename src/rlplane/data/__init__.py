"""Prompts as ``DatumSpec`` records: procedural arithmetic, JSONL files, and a resumable loader.

Names are imported from their modules on first use: the config reads NeMo RL's registry table
(``rlplane.data.registry``, pure Python) to translate NeMo RL's files, and validating a config must not wait
for torch, which the datasets themselves import.
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
    module, attr = _RENAMED.get(name) or (_MODULE_OF.get(name), name)
    if module is None:
        raise AttributeError(f"module 'rlplane.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rlplane.data.{module}"), attr)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
