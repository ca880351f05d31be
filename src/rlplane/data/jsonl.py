"""JSONL prompt datasets, one ``{"problem", "answer", "task_name"}`` object per line; every user mistake is a
one-line ``DatasetError`` naming the file and line."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from torch.utils.data import Dataset
from transformers import PreTrainedTokenizerBase

from rlplane.data.datum import DatumSpec, PromptFormat, make_prompt_datum
from rlplane.data.errors import DatasetError


@dataclass(frozen=True)
class JsonlFields:
    """Which keys of a row hold what. ``task_name`` is optional per row (``default_task_name`` fills in)."""

    problem: str = "problem"
    answer: str = "answer"
    task_name: str = "task_name"
    default_task_name: str = "arithmetic"


def decode_line(raw: bytes, path: str, line_no: int) -> str:
    """One line as UTF-8 (a BOM on line 1 allowed), or a one-line ``DatasetError`` naming line and column."""
    try:
        return raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(
            f"dataset {path}, line {line_no}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
            "convert the file to UTF-8, e.g. iconv -f latin1 -t utf-8"
        ) from None


def answer_text(value, key: str, path: str, line_no: int) -> str:
    """A row's answer as text: a non-empty string or a number (anything else would score its repr)."""
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    got = "an empty string" if isinstance(value, str) else f"{json.dumps(value)} ({type(value).__name__})"
    raise DatasetError(f"dataset {path}, line {line_no}: field {key!r} is {got}; the reference answer must be a "
                       "non-empty string or a number")


def read_jsonl_rows(path: str, fields: JsonlFields = JsonlFields()) -> list[dict]:
    """Rows as ``{"problem", "answer", "task_name", "line"}`` (1-based; blanks skipped), with ``extra_env_info``
    holding any other fields."""
    if not os.path.isfile(path):
        what = "is a directory, not a file" if os.path.isdir(path) else "no such file"
        raise DatasetError(f"dataset {path}: {what}")
    rows = []
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            line = decode_line(raw, path, line_no)
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(
                    f"dataset {path}, line {line_no}: not valid JSON ({e.msg} at column {e.colno})"
                ) from None
            if not isinstance(obj, dict):
                raise DatasetError(f"dataset {path}, line {line_no}: expected a JSON object, got {type(obj).__name__}")
            missing = [k for k in (fields.problem, fields.answer) if k not in obj]
            if missing:
                have = ", ".join(sorted(obj)) or "none"
                raise DatasetError(
                    f"dataset {path}, line {line_no}: missing field {missing[0]!r} (row has: {have}); "
                    f"fix the row or set the field name in the data config"
                )
            row = {
                "problem": str(obj[fields.problem]),
                "answer": answer_text(obj[fields.answer], fields.answer, path, line_no),
                "task_name": str(obj.get(fields.task_name) or fields.default_task_name),
                "line": line_no,
            }
            # The row's other fields reach the environment (a user reward function's `extra`).
            extra = {k: v for k, v in obj.items() if k not in (fields.problem, fields.answer, fields.task_name)}
            if extra:
                row["extra_env_info"] = extra
            rows.append(row)
    if not rows:
        raise DatasetError(f"dataset {path}: empty (no rows); add at least one JSON object per line")
    return rows


class PromptDataset(Dataset):
    """Prompts tokenized up front into ``DatumSpec``; overlong ones are skipped and counted
    (``num_skipped_overlong``) or raise (``on_overlong="error"``)."""

    def __init__(
        self,
        rows: list[dict],
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_prompt_length: int | None = None,
        on_overlong: str = "skip",
        prompt_format: PromptFormat = PromptFormat(),
        source: str = "dataset",
    ):
        if on_overlong not in ("skip", "error"):
            raise DatasetError(f"on_overlong = {on_overlong!r}: must be 'skip' or 'error'")
        self.datums: list[DatumSpec] = []
        self.num_skipped_overlong = 0
        for row in rows:
            datum = make_prompt_datum(
                row["problem"], row["answer"], tokenizer,
                idx=len(self.datums), task_name=row["task_name"], prompt_format=prompt_format,
                extra_env_info=row.get("extra_env_info"),
            )
            if max_prompt_length is not None and datum.length > max_prompt_length:
                if on_overlong == "error":
                    where = f"{source}, line {row['line']}" if "line" in row else source
                    raise DatasetError(
                        f"{where}: prompt is {datum.length} tokens, over max_prompt_length = {max_prompt_length}; "
                        "shorten it, raise the maximum, or skip such prompts (on_overlong: skip)"
                    )
                self.num_skipped_overlong += 1
                continue
            self.datums.append(datum)
        if not self.datums:
            raise DatasetError(
                f"{source}: no prompts left ({self.num_skipped_overlong} of {len(rows)} longer than "
                f"max_prompt_length = {max_prompt_length}); raise the maximum"
            )

    def __len__(self) -> int:
        return len(self.datums)

    def __getitem__(self, idx: int) -> DatumSpec:
        return self.datums[idx]


def load_jsonl_dataset(
    path: str,
    tokenizer: PreTrainedTokenizerBase,
    *,
    fields: JsonlFields = JsonlFields(),
    max_prompt_length: int | None = None,
    on_overlong: str = "skip",
    prompt_format: PromptFormat = PromptFormat(),
) -> PromptDataset:
    """Read, validate and tokenize a JSONL prompt file (see the module docstring for its errors)."""
    rows = read_jsonl_rows(path, fields)
    return PromptDataset(
        rows, tokenizer, max_prompt_length=max_prompt_length, on_overlong=on_overlong,
        prompt_format=prompt_format, source=f"dataset {path}",
    )
