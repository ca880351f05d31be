"""Prompt rows read by HF ``datasets`` (``rlplane[hf]``): local JSON/JSONL, Parquet or CSV files, a hub dataset
by id, or a NeMo RL registry dataset by name, as JSONL rows with the same one-line ``DatasetError``s (answers
checked too; rows counted from 1)."""

from __future__ import annotations

import glob
import importlib.util
import os

from rlplane.data.errors import DatasetError
from rlplane.data.hub import is_local, load_rows
from rlplane.data.jsonl import JsonlFields, answer_text, bounded_lines, decode_line, too_many_rows
from rlplane.data.registry import HubCopy, Source, entry, registry_rows

_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def _files(path: str) -> list[str]:
    if os.path.isdir(path):
        files = sorted(f for f in glob.glob(os.path.join(path, "*")) if os.path.splitext(f)[1] in _FORMATS)
    else:
        files = sorted(glob.glob(path)) if any(c in path for c in "*?[") else [path]
    files = [f for f in files if os.path.isfile(f)]  # not a directory, a FIFO (open would wait) or a device
    if not files:
        raise DatasetError(f"dataset {path}: no such file (or no .json/.jsonl/.parquet/.csv files there)")
    return files


def _check_files(files: list[str], file_format: str, path: str, max_rows: int | None) -> None:
    """Before datasets converts the files: text files' lines are UTF-8 (say which is not: datasets says only
    that it failed) and within MAX_ROW_BYTES; Parquet files' footers hold at most ``max_rows`` rows. (A text
    file's rows are counted once read: a CSV field or a JSON array may span lines.)"""
    rows = 0
    for f in files:
        if file_format != "parquet":
            with open(f, "rb") as fh:
                for line_no, raw in bounded_lines(fh, f):
                    decode_line(raw, f, line_no)
        elif max_rows is not None:
            import pyarrow.parquet as pq

            try:
                rows += pq.read_metadata(f).num_rows
            except Exception:  # noqa: BLE001 - not Parquet: datasets' own error says what
                continue
            if rows > max_rows:
                raise too_many_rows(path, max_rows)


def read_hf_rows(path: str, fields: JsonlFields = JsonlFields(), file_format: str = "auto",
                 split: str = "train", *, subset: str | None = None, key: str = "data.train",
                 max_rows: int | None = None) -> list[dict]:
    """Rows as ``{"problem", "answer", "task_name", "line"}`` dicts (``line`` is the 1-based row number); ``path``
    local files, or a hub id read through the Hugging Face cache (``rlplane.data.hub``); more than ``max_rows``
    (``data.max_rows``) is an error."""
    if importlib.util.find_spec("datasets") is None:
        raise DatasetError(f"dataset {path}: dataset kind 'hf' needs the datasets package: pip install 'rlplane[hf]'")
    if not is_local(path):  # a hub id, as NeMo RL's ResponseDataset reads one
        return table_rows(load_rows(HubCopy(path, subset, split), f"{key}.path = {path!r}", f"{key}.path"), fields,
                          path, key, max_rows=max_rows)
    files = _files(path)
    if file_format == "auto":
        exts = {os.path.splitext(f)[1] for f in files}
        formats = {_FORMATS.get(e) for e in exts}
        if len(formats) != 1 or None in formats:
            raise DatasetError(
                f"dataset {path}: cannot tell the format from "
                f"{', '.join(sorted(exts))}; set {key}.format (json, parquet or csv)"
            )
        file_format = formats.pop()
    _check_files(files, file_format, path, max_rows)
    import datasets

    datasets.disable_progress_bars()
    level = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its own "Failed to read file" line is ours to say
    try:
        ds = datasets.load_dataset(file_format, data_files={split: files}, split=split)
    except Exception as e:  # datasets wraps parse errors in many types
        # The wrapper says "An error occurred while generating the dataset"; the cause says what.
        while e.__cause__ is not None or e.__context__ is not None:
            e = e.__cause__ or e.__context__
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DatasetError(f"dataset {path}: cannot read it as {file_format}: "
                           f"{reason}; fix the file or set {key}.format") from None
    finally:
        datasets.logging.set_verbosity(level)
    return table_rows(ds, fields, path, key, max_rows=max_rows)


def table_rows(ds, fields: JsonlFields, path: str, key: str = "data.train", *,
               max_rows: int | None = None) -> list[dict]:
    """A table's rows (a ``datasets.Dataset``) as prompt rows; its problem and answer columns must be there."""
    missing = [k for k in (fields.problem, fields.answer) if k not in ds.column_names]
    if missing:
        raise DatasetError(
            f"dataset {path}: no column {missing[0]!r} (columns: {', '.join(ds.column_names)}); set "
            f"{key}.{'problem_key' if missing[0] == fields.problem else 'answer_key'} to the right column"
        )
    if len(ds) == 0:
        raise DatasetError(f"dataset {path}: empty (no rows)")
    if max_rows is not None and len(ds) > max_rows:
        raise too_many_rows(path, max_rows)
    has_task = fields.task_name in ds.column_names
    rows = []
    for i, row in enumerate(ds, start=1):
        rows.append({
            "problem": str(row[fields.problem]),
            "answer": answer_text(row[fields.answer], fields.answer, path, i, unit="row"),
            "task_name": str((row[fields.task_name] if has_task else None) or fields.default_task_name),
            "line": i,
        })
    return rows


def registry_source(source, key: str) -> Source:
    """The registry :class:`Source` of a ``data.train`` / ``data.validation`` section: its ``options`` plus the
    generic ``split``, ``subset`` and ``seed`` where the dataset takes them (a split it does not take must be its
    own one)."""
    e = entry(source.name, f"{key}.name")
    options = dict(source.options)
    for name, value in (("split", source.split), ("subset", source.subset), ("seed", source.seed)):
        if value is None or name in options:
            continue
        if name in e.defaults:
            options[name] = value
        elif name != "seed" and not e.needs_path:
            fixed = {getattr(c, name) for c in e.copies(e.defaults)}
            if fixed != {value}:
                raise DatasetError(f"{key}.{name} = {value!r}: {e.name} reads {name} "
                                   f"{', '.join(sorted(map(str, fixed)))} only; remove it")
    return Source(source.name, options, source.path)


def read_registry_rows(source, fields: JsonlFields, key: str, *, require: bool = True) -> list[dict]:
    """The prompt rows of a registry source (NeMo RL's rows, ``line`` counting from 1, ``task_name`` from the
    source's ``default_task_name``: the environment that scores them)."""
    src = registry_source(source, key)
    where = f"{key}.name = {src.name!r}"
    rows = registry_rows(src, lambda c: load_rows(c, where, f"{key}.path"), where)
    if not rows:
        raise DatasetError(f"{where}: no rows")
    out = []
    for i, row in enumerate(rows, start=1):
        row = {**row, "task_name": fields.default_task_name, "line": i}
        if "answer" in row:
            row["answer"] = answer_text(row["answer"], "answer", f"{src.name} ({key})", i, unit="row")
        elif require:
            raise DatasetError(f"{where}, row {i}: no problem and answer (it has {len(row['messages'])} message(s)); "
                               "give its task a processor function that reads `messages` (data.prompt.processor)")
        out.append(row)
    return out
