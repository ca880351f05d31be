"""Prompts as ``DatumSpec`` records: procedural arithmetic, JSONL files, and a resumable loader.

Names are imported from their modules on first use: the config reads NeMo RL's registry table
(``rlplane.data.registry``, pure Python) to translate NeMo RL's files, and validating a config must not wait
for torch, which the datasets themselves import.
"""

from __future__ import annotations

from rlplane.lazy_names import lazy_names

_HOMES = {
    "arithmetic": ("ArithmeticDataset", "ArithmeticSpec", "build_eval_set", "is_heldout"),
    "dataloader": ("PromptDataLoader",),
    "datum": ("DatumSpec", "Message", "PromptFormat", "make_prompt_datum"),
    "errors": ("DatasetError",),
    "jsonl": ("JsonlFields", "PromptDataset", "load_jsonl_dataset", "read_jsonl_rows"),
    "tasks": ("AllTaskProcessedDataset", "TaskDataSpec"),
}
_RENAMED = {"ARITHMETIC_TASK": ("arithmetic", "TASK_NAME")}

__all__, __getattr__, __dir__ = lazy_names(__name__, _HOMES, _RENAMED)
