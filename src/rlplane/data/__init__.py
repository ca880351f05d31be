"""Prompts as ``DatumSpec`` records: procedural arithmetic, JSONL files, and a resumable loader."""

from rlplane.data.arithmetic import (
    TASK_NAME as ARITHMETIC_TASK,
    ArithmeticDataset,
    ArithmeticSpec,
    build_eval_set,
    is_heldout,
)
from rlplane.data.dataloader import PromptDataLoader
from rlplane.data.datum import DatumSpec, Message, PromptFormat, make_prompt_datum
from rlplane.data.errors import DatasetError
from rlplane.data.jsonl import JsonlFields, PromptDataset, load_jsonl_dataset, read_jsonl_rows
from rlplane.data.tasks import AllTaskProcessedDataset, TaskDataSpec

__all__ = [
    "AllTaskProcessedDataset",
    "ARITHMETIC_TASK",
    "ArithmeticDataset",
    "ArithmeticSpec",
    "DatasetError",
    "DatumSpec",
    "JsonlFields",
    "Message",
    "PromptDataLoader",
    "PromptDataset",
    "PromptFormat",
    "TaskDataSpec",
    "build_eval_set",
    "is_heldout",
    "load_jsonl_dataset",
    "make_prompt_datum",
    "read_jsonl_rows",
]
