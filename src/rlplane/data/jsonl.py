"""JSONL prompt datasets, one ``{"problem", "answer", "task_name"}`` object per line; every user mistake is a
one-line ``DatasetError`` naming the file and line."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from rlplane.data.datum import PromptFormat
from rlplane.data.errors import DatasetError
from rlplane.data.processors import prompt_data_processor
from rlplane.data.tasks import AllTaskProcessedDataset, TaskDataSpec

# Reading a data file is bounded per row and in rows: a file with no newline, or rows nested without end, is one
# line naming the file and the limit. A prompt is a few KB; NeMo RL's datasets nest 3 levels.
MAX_ROW_BYTES = 16 << 20
MAX_ROW_DEPTH = 32


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


def bounded_lines(f, path: str):
    """``(line number, raw bytes)`` of a binary file, each line at most :data:`MAX_ROW_BYTES` (read no further)."""
    line_no = 0
    while raw := f.readline(MAX_ROW_BYTES + 1):
        line_no += 1
        if len(raw) > MAX_ROW_BYTES:
            raise DatasetError(f"dataset {path}, line {line_no}: longer than {MAX_ROW_BYTES:,} bytes, over "
                               f"MAX_ROW_BYTES = {MAX_ROW_BYTES:,} (a prompt is a few KB); is this a data file with "
                               "one row per line? (a JSON array on one line: save it as JSON Lines)")
        yield line_no, raw


def _count_lines(f) -> int:
    """Lines of a binary file, counted in large blocks (an upper bound on its rows, at the speed of a read)."""
    lines, last = 0, b"\n"
    while block := f.read(1 << 24):
        lines, last = lines + block.count(b"\n"), block[-1:]
    return lines + (last != b"\n")


def too_many_rows(path: str, max_rows: int) -> DatasetError:
    return DatasetError(f"dataset {path}: more than {max_rows:,} rows, over data.max_rows = {max_rows:,} (every row "
                        "is tokenized and held at start-up); raise data.max_rows, or cut the file to the rows the run "
                        "will use")


def _too_deep(path: str, line_no: int) -> DatasetError:
    return DatasetError(f"dataset {path}, line {line_no}: nested more than {MAX_ROW_DEPTH} levels deep, over "
                        f"MAX_ROW_DEPTH = {MAX_ROW_DEPTH}; flatten the row's fields")


def _depth(obj) -> int:
    """Nesting of a parsed JSON value (a scalar is 0), without recursion."""
    deepest, stack = 0, [(obj, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth + 1)
            if deepest > MAX_ROW_DEPTH:
                break
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def read_jsonl_rows(path: str, fields: JsonlFields = JsonlFields(), *, require: bool = True,
                    max_rows: int | None = None) -> list[dict]:
    """Rows as ``{"problem", "answer", "task_name", "line"}`` (1-based; blanks skipped), with ``extra_env_info``
    holding any other fields (also kept at the top level); ``require=False``: problem and answer may be absent.
    More than ``max_rows`` rows (``data.max_rows``) is an error, said before the rest is read."""
    if not os.path.isfile(path):
        what = "is a directory, not a file" if os.path.isdir(path) else "no such file"
        raise DatasetError(f"dataset {path}: {what}")
    rows = []
    with open(path, "rb") as f:
        if max_rows is not None and _count_lines(f) > max_rows:  # before any row is kept; blank lines are no rows
            f.seek(0)
            if sum(1 for _, raw in bounded_lines(f, path) if raw.strip()) > max_rows:
                raise too_many_rows(path, max_rows)
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
                raise _too_deep(path, line_no) from None
            if _depth(obj) > MAX_ROW_DEPTH:
                raise _too_deep(path, line_no)
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
