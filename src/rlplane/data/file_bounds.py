"""Bounds on a text data file's lines and rows, read in large blocks at the speed of a read: plain Python, so the
command line checks a run's data files with its config, before torch, transformers or Ray is imported, and a
file past a bound costs a second, not the imports of a run that was never going to start.

A line is at most :data:`MAX_ROW_BYTES` (a prompt is a few KB); a JSON Lines file holds at most ``data.max_rows``
rows (lines with something on them), each nested at most :data:`MAX_ROW_DEPTH` deep (the check parses only the
lines where a run of more than that many openers, each inside the last, is seen). The readers (``data/jsonl.py``,
``data/hf_files.py``) keep the same bounds as they read, for files that change between the check and the read and
for callers that skip the check.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator

from rlplane.data.errors import DatasetError, unreadable

MAX_ROW_BYTES = 16 << 20
MAX_ROW_DEPTH = 32  # NeMo RL's datasets nest 3 levels
_BLOCK = 1 << 24
_SCAN_BLOCK = 1 << 22  # below MAX_ROW_BYTES: a line longer than that is carried across blocks
_ROW = re.compile(rb"^[ \t\r\f\v]*\S", re.M)  # a line with something on it (bytes.strip()'s whitespace)
# A row's brackets with everything else deleted (a C-speed pass); more than MAX_ROW_DEPTH openers in a row there is a
# candidate, parsed to be sure (the brackets may be inside a string). Nesting that closes siblings on its way down
# ("[[],[[],[...") is not seen here: the reader, which parses every row, refuses it.
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}\n")
_RUN = re.compile(rb"[\[{]{%d}" % (MAX_ROW_DEPTH + 1))


def too_many_rows(path: str, max_rows: int) -> DatasetError:
    return DatasetError(f"dataset {path}: more than {max_rows:,} rows, over data.max_rows = {max_rows:,} (every row "
                        "is tokenized and held at start-up); raise data.max_rows, or cut the file to the rows the run "
                        "will use")


def line_too_long(path: str, line_no: int) -> DatasetError:
    return DatasetError(f"dataset {path}, line {line_no}: longer than {MAX_ROW_BYTES:,} bytes, over "
                        f"MAX_ROW_BYTES = {MAX_ROW_BYTES:,} (a prompt is a few KB); is this a data file with "
                        "one row per line? (a JSON array on one line: save it as JSON Lines)")


def too_deep(path: str, line_no: int) -> DatasetError:
    return DatasetError(f"dataset {path}, line {line_no}: nested more than {MAX_ROW_DEPTH} levels deep, over "
                        f"MAX_ROW_DEPTH = {MAX_ROW_DEPTH}; flatten the row's fields")


def depth(obj) -> int:
    """Nesting of a parsed JSON value (a scalar is 0), without recursion; counted no further than past
    :data:`MAX_ROW_DEPTH`."""
    deepest, stack = 0, [(obj, 0)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, d + 1)
            if deepest > MAX_ROW_DEPTH:
                break
            stack.extend((child, d + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def _row_too_deep(raw: bytes) -> bool:
    try:
        return depth(json.loads(raw)) > MAX_ROW_DEPTH
    except RecursionError:  # nested past what the parser recurses into
        return True
    except ValueError:  # not JSON: the reader names it
        return False


def _first_deep_line(block: bytes, end: int) -> int | None:
    """0-based line (within ``block[:end]``, which ends at a newline) of the first row nested past the bound."""
    compact = block[:end].translate(None, _NOT_BRACKETS)
    line = cpos = 0  # the candidate's line, counted in ``compact`` up to cpos
    at_line, offset, checked = 0, 0, -1  # a line of ``block`` and where it starts
    for m in _RUN.finditer(compact):
        line += compact.count(b"\n", cpos, m.start())
        cpos = m.start()
        if line == checked:
            continue
        while at_line < line:
            offset, at_line = block.index(b"\n", offset) + 1, at_line + 1
        if _row_too_deep(block[offset:block.index(b"\n", offset, end)]):
            return line
        checked = line
    return None


def bounded_lines(f, path: str) -> Iterator[tuple[int, bytes]]:
    """``(line number, raw bytes)`` of a binary file, each line at most :data:`MAX_ROW_BYTES` (read no further)."""
    line_no = 0
    while raw := f.readline(MAX_ROW_BYTES + 1):
        line_no += 1
        if len(raw) > MAX_ROW_BYTES:
            raise line_too_long(path, line_no)
        yield line_no, raw


def count_lines(f) -> int:
    """Lines of a binary file, counted in large blocks (an upper bound on its rows, at the speed of a read)."""
    lines, last = 0, b"\n"
    while block := f.read(_BLOCK):
        lines, last = lines + block.count(b"\n"), block[-1:]
    return lines + (last != b"\n")


def scan(f, path: str, max_rows: int | None, json_rows: bool = False) -> int:
    """Rows (non-blank lines) of a binary file read from its start in blocks smaller than a line may be; a line past
    :data:`MAX_ROW_BYTES` (its newline counted, as :func:`bounded_lines` counts it), rows past ``max_rows``
    (None: any) or, with ``json_rows``, a row nested past :data:`MAX_ROW_DEPTH` raise once the block that shows
    them is read. Only the line carried from block to block can grow past the bound, so only its length is
    watched."""
    rows = newlines = 0
    carry = b""
    while read := f.read(_SCAN_BLOCK):
        block = carry + read if carry else read
        first = block.find(b"\n")
        if first < 0:
            carry = block
        else:
            if first + 1 > MAX_ROW_BYTES:
                raise line_too_long(path, newlines + 1)
            cut = block.rfind(b"\n") + 1
            if json_rows and (deep := _first_deep_line(block, cut)) is not None:
                raise too_deep(path, newlines + deep + 1)
            rows += len(_ROW.findall(block, 0, cut))
            newlines += block.count(b"\n", 0, cut)
            carry = block[cut:]
        if len(carry) > MAX_ROW_BYTES:
            raise line_too_long(path, newlines + 1)
        if max_rows is not None and rows > max_rows:
            raise too_many_rows(path, max_rows)
    rows += bool(carry.strip())
    if json_rows and carry and _first_deep_line(carry + b"\n", len(carry) + 1) is not None:
        raise too_deep(path, newlines + 1)
    if max_rows is not None and rows > max_rows:
        raise too_many_rows(path, max_rows)
    return rows


def check_text_file(path: str, max_rows: int | None, json_rows: bool = False) -> None:
    """A data file's lines and rows (``json_rows``: JSON Lines rows' nesting too) within their bounds; one line
    naming the file and the bound if not. A file that cannot be read is left to the reader, which says why."""
    if unreadable(path) is not None:
        return
    try:
        with open(path, "rb") as f:
            scan(f, path, max_rows, json_rows)
    except OSError:
        return


def check_data_files(data) -> None:
    """A run's data files (a ``data`` config section) within their bounds: JSON Lines files' lines and rows, and
    the lines of an ``hf`` kind's local JSON or CSV file (whose rows may span lines: they are counted as read)."""
    for source in (data.train, data.validation):
        path = getattr(source, "path", None)
        if not path or any(c in path for c in "*?["):
            continue
        ext = os.path.splitext(path)[1]
        if data.dataset == "jsonl" or (data.dataset == "hf" and ext == ".jsonl"):
            check_text_file(path, data.max_rows, json_rows=True)
        elif data.dataset == "hf" and ext in (".json", ".csv"):
            check_text_file(path, None)
