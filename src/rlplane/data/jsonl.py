"""JSONL prompt datasets, one ``{"problem", "answer", "task_name"}`` object per line; every user mistake is a
one-line ``DatasetError`` naming the file and line."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from rlplane.data.datum import PromptFormat
from rlplane.data.errors import DatasetError, unreadable
from rlplane.data.file_bounds import MAX_ROW_DEPTH, bounded_lines, count_lines, depth, scan, too_deep
from rlplane.data.processors import prompt_data_processor
from rlplane.data.tasks import AllTaskProcessedDataset, TaskDataSpec

# Reading a data file is bounded per row and in rows: a file with no newline (data/file_bounds.py), or rows nested
# without end, is one line naming the file and the limit. NeMo RL's datasets nest 3 levels.


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


def answer_text(value, key: str, path: str, line_no: int, unit: str = "line") -> str:
    """A row's answer as text: a non-empty string or a finite number (anything else would score its repr).
    ``unit`` names what ``line_no`` counts: a file's line or a table's row."""
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return str(value)
    try:
        shown = json.dumps(value)
    except (TypeError, ValueError):  # a type JSON cannot show (bytes, a timestamp from a Parquet column)
        shown = repr(value)[:80]
    got = "an empty string" if isinstance(value, str) else f"{shown} ({type(value).__name__})"
    raise DatasetError(f"dataset {path}, {unit} {line_no}: field {key!r} is {got}; the reference answer must be a "
                       "non-empty string or a number")


def read_jsonl_rows(path: str, fields: JsonlFields = JsonlFields(), *, require: bool = True,
                    max_rows: int | None = None) -> list[dict]:
    """Rows as ``{"problem", "answer", "task_name", "line"}`` (1-based; blanks skipped), with ``extra_env_info``
    holding any other fields (also kept at the top level); ``require=False``: problem and answer may be absent.
    More than ``max_rows`` rows (``data.max_rows``) is an error, said before the rest is read."""
    if (why := unreadable(path)) is not None:
        raise DatasetError(f"dataset {path}: {why}")
    rows = []
    with open(path, "rb") as f:
        if max_rows is not None and count_lines(f) > max_rows:  # before any row is kept; blank lines are no rows
            f.seek(0)
            scan(f, path, max_rows)
        f.seek(0)
        for line_no, raw in bounded_lines(f, path):
            line = decode_line(raw, path, line_no)
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(
                    f"dataset {path}, line {line_no}: not valid JSON ({e.msg} at column {e.colno})"
                ) from None
            except RecursionError:  # nested past what the parser recurses into
                raise too_deep(path, line_no) from None
            if depth(obj) > MAX_ROW_DEPTH:
                raise too_deep(path, line_no)
            if not isinstance(obj, dict):
                raise DatasetError(f"dataset {path}, line {line_no}: expected a JSON object, got {type(obj).__name__}")
            rows.append(_row(obj, fields, path, line_no, require))
    if not rows:
        raise DatasetError(f"dataset {path}: empty (no rows); add at least one JSON object per line")
    return rows


def _row(obj: dict, fields: JsonlFields, path: str, line_no: int, require: bool) -> dict:
    missing = [k for k in (fields.problem, fields.answer) if k not in obj]
    if missing and require:
        have = ", ".join(sorted(obj)) or "none"
        raise DatasetError(
            f"dataset {path}, line {line_no}: missing field {missing[0]!r} (row has: {have}); "
            f"fix the row or set the field name in the data config"
        )
    # The line's own fields too (a processor function reads them, as NeMo RL's datum_dict).
    row = {k: v for k, v in obj.items() if k not in ("problem", "answer", "task_name", "line")}
    if not missing:
        row["problem"] = str(obj[fields.problem])
        row["answer"] = answer_text(obj[fields.answer], fields.answer, path, line_no)
    row["task_name"] = str(obj.get(fields.task_name) or fields.default_task_name)
    row["line"] = line_no
    # The row's other fields reach the environment (a user reward function's `extra`).
    extra = {k: v for k, v in obj.items() if k not in (fields.problem, fields.answer, fields.task_name)}
    if extra:
        row["extra_env_info"] = extra
    return row


class PromptDataset(AllTaskProcessedDataset):
    """``{problem, answer, task_name}`` rows through one prompt format; overlong prompts skipped and counted
    (``num_skipped_overlong``), kept with ``loss_multiplier = 0`` (``"zero_loss"``) or an error (``"error"``)."""

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
        super().__init__(rows, tokenizer, TaskDataSpec(base_format=prompt_format), prompt_data_processor,
                         max_seq_length=max_prompt_length, on_overlong=on_overlong, source=source)


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
