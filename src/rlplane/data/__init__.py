"""Prompts as ``DatumSpec`` records: procedural arithmetic, JSONL files, and a resumable loader.

Names load on first use (PEP 562): config validation reads ``rlplane.data.registry`` (plain tables) without
importing torch through the datasets here.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "ARITHMETIC_TASK": ("rlplane.data.arithmetic", "TASK_NAME"),
    "ArithmeticDataset": ("rlplane.data.arithmetic", "ArithmeticDataset"),
    "ArithmeticSpec": ("rlplane.data.arithmetic", "ArithmeticSpec"),
    "build_eval_set": ("rlplane.data.arithmetic", "build_eval_set"),
    "is_heldout": ("rlplane.data.arithmetic", "is_heldout"),
    "PromptDataLoader": ("rlplane.data.dataloader", "PromptDataLoader"),
    "DatumSpec": ("rlplane.data.datum", "DatumSpec"),
    "Message": ("rlplane.data.datum", "Message"),
    "PromptFormat": ("rlplane.data.datum", "PromptFormat"),
    "make_prompt_datum": ("rlplane.data.datum", "make_prompt_datum"),
    "DatasetError": ("rlplane.data.errors", "DatasetError"),
    "JsonlFields": ("rlplane.data.jsonl", "JsonlFields"),
    "PromptDataset": ("rlplane.data.jsonl", "PromptDataset"),
    "load_jsonl_dataset": ("rlplane.data.jsonl", "load_jsonl_dataset"),
    "read_jsonl_rows": ("rlplane.data.jsonl", "read_jsonl_rows"),
    "AllTaskProcessedDataset": ("rlplane.data.tasks", "AllTaskProcessedDataset"),
    "TaskDataSpec": ("rlplane.data.tasks", "TaskDataSpec"),
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'rlplane.data' has no attribute {name!r}")
    module, attr = _WHERE[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value
