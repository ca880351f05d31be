"""Reading data, prompt and checkpoint files is bounded: a line with no end, rows nested without end, more rows
than ``data.max_rows``, a prompt file that is a device or a FIFO, a checkpoint whose header claims more than the
file holds or whose records would expand: each one line naming the file and the limit, in bounded memory
(tracemalloc's peak, not a timing), before the rest is read."""

from __future__ import annotations

import json
import os
import tracemalloc
import zipfile

import pytest
import torch

from rlplane.data import file_bounds, hf_files
from rlplane.data.errors import DatasetError
from rlplane.data.file_bounds import MAX_ROW_BYTES
from rlplane.data.jsonl import MAX_ROW_DEPTH, read_jsonl_rows
from rlplane.data.task_spec import TaskDataSpec
from rlplane.utils.checkpoint import CheckpointError, load_torch_state, load_weights, weight_shapes

ROW = '{"problem": "1+1=", "answer": "2"}\n'


def one_line(exc_type, fn, peak_mb: int = 64) -> str:
    tracemalloc.start()
    try:
        with pytest.raises(exc_type) as e:
            fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < peak_mb * 2**20, f"peak {peak / 2**20:.0f} MB"
    (line,) = str(e.value).splitlines()
    return line


def test_a_line_with_no_end_is_refused_after_the_limit(tmp_path):
    """A 64 MiB file without a newline (a binary file named .jsonl): read up to the limit, not whole."""
    f = tmp_path / "d.jsonl"
    f.write_text(ROW)
    with open(f, "ab") as out:
        out.write(b"x" * (64 << 20))
    line = one_line(DatasetError, lambda: read_jsonl_rows(str(f)), peak_mb=3 * (MAX_ROW_BYTES >> 20))
    assert line == (f"dataset {f}, line 2: longer than 16,777,216 bytes, over MAX_ROW_BYTES = 16,777,216 (a prompt "
                    "is a few KB); is this a data file with one row per line? (a JSON array on one line: save it as "
                    "JSON Lines)")


@pytest.mark.parametrize("depth", [MAX_ROW_DEPTH + 1, 100_000], ids=["just-over", "past-the-parser"])
def test_rows_nested_too_deep_are_refused(tmp_path, depth):
    f = tmp_path / "d.jsonl"
    f.write_text(ROW + '{"problem": "1+1=", "answer": "2", "x": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}\n")
    line = one_line(DatasetError, lambda: read_jsonl_rows(str(f)))
    assert line == (f"dataset {f}, line 2: nested more than 32 levels deep, over MAX_ROW_DEPTH = 32; flatten the "
                    "row's fields")


def test_nesting_within_the_limit_is_kept(tmp_path):
    f = tmp_path / "d.jsonl"
    nested = "[" * (MAX_ROW_DEPTH - 1) + "]" * (MAX_ROW_DEPTH - 1)
    f.write_text('{"problem": "1+1=", "answer": "2", "x": ' + nested + "}\n")
    assert read_jsonl_rows(str(f))[0]["extra_env_info"]["x"] is not None


def _deep_dicts(n: int) -> str:
    return '{"k": ' * n + "1" + "}" * n


@pytest.mark.parametrize("block", [None, 64], ids=["one-block", "across-blocks"])
def test_the_start_up_check_finds_deep_rows_before_any_import(tmp_path, monkeypatch, block):
    """The command line's check (plain Python, before torch) refuses a row nested past the bound, lists or objects,
    on the line it is on; brackets inside a string, or a row within the bound, pass; a blank line counts."""
    if block is not None:  # rows longer than a read: the deep row is found where its line ends
        monkeypatch.setattr(file_bounds, "_SCAN_BLOCK", block)
    cases = {
        "lists": "[" * (MAX_ROW_DEPTH + 1) + "]" * (MAX_ROW_DEPTH + 1),
        "objects": _deep_dicts(MAX_ROW_DEPTH + 1),
        "past-the-parser": "[" * 100_000 + "]" * 100_000,
    }
    for name, value in cases.items():
        f = tmp_path / f"{name}.jsonl"
        f.write_text(ROW + "\n" + '{"problem": "1+1=", "answer": "2", "x": ' + value + "}\n" + ROW)
        with pytest.raises(DatasetError) as e:
            file_bounds.check_text_file(str(f), None, json_rows=True)
        assert str(e.value) == (f"dataset {f}, line 3: nested more than 32 levels deep, over MAX_ROW_DEPTH = 32; "
                                "flatten the row's fields"), name
        file_bounds.check_text_file(str(f), None)  # a file that is not JSON Lines: no depth to check
    fine = tmp_path / "fine.jsonl"
    fine.write_text(json.dumps({"problem": "[" * 200 + " balance these", "answer": "x", "y": _deep_dicts(40)}) + "\n"
                    + '{"problem": "p", "answer": "a", "x": ' + _deep_dicts(MAX_ROW_DEPTH - 1) + "}\n" + ROW)
    assert file_bounds.check_text_file(str(fine), None, json_rows=True) is None
    broken = tmp_path / "broken.jsonl"  # a run of openers on a line that is no JSON: the reader names it
    broken.write_text(ROW + "[" * 40 + "\n")
    assert file_bounds.check_text_file(str(broken), None, json_rows=True) is None
    many = tmp_path / "many.jsonl"  # candidates on every line (brackets in strings) before the deep row
    many.write_text(fine.read_text() * 50 + '{"x": ' + "[" * 40 + "]" * 40 + "}\n" + ROW)
    with pytest.raises(DatasetError, match=r"line 151: nested more than 32"):
        file_bounds.check_text_file(str(many), None, json_rows=True)
    last = tmp_path / "last.jsonl"  # the deep row is the last line, with no newline after it
    last.write_text(ROW + '{"x": ' + "[" * 40 + "]" * 40 + "}")
    with pytest.raises(DatasetError, match=r"line 2: nested more than 32"):
        file_bounds.check_text_file(str(last), None, json_rows=True)


def test_more_rows_than_max_rows_stops_reading_there(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text(ROW * 11)
    assert len(read_jsonl_rows(str(f), max_rows=11)) == 11
    line = one_line(DatasetError, lambda: read_jsonl_rows(str(f), max_rows=10))
    assert line == (f"dataset {f}: more than 10 rows, over data.max_rows = 10 (every row is tokenized and held at "
                    "start-up); raise data.max_rows, or cut the file to the rows the run will use")


@pytest.mark.parametrize("fmt", ["csv", "parquet", "json"])
def test_hf_files_are_held_to_max_rows(tmp_path, fmt):
    pytest.importorskip("datasets")
    rows = [{"problem": f"{i}+1=", "answer": str(i + 1)} for i in range(11)]
    f = tmp_path / f"d.{fmt}"
    if fmt == "csv":
        f.write_text("problem,answer\n" + "".join(f"{r['problem']},{r['answer']}\n" for r in rows))
    elif fmt == "json":
        f.write_text(json.dumps(rows))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), f)
    assert len(hf_files.read_hf_rows(str(f), max_rows=11)) == 11
    with pytest.raises(DatasetError, match=r"more than 10 rows, over data.max_rows = 10"):
        hf_files.read_hf_rows(str(f), max_rows=10)


def test_a_csv_line_with_no_end_is_refused_before_datasets_reads_it(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.setattr(file_bounds, "MAX_ROW_BYTES", 1024)
    f = tmp_path / "d.csv"
    f.write_text("problem,answer\n1+1=," + "2" * 5000 + "\n")
    with pytest.raises(DatasetError, match=r"d.csv, line 2: longer than 1,024 bytes, over MAX_ROW_BYTES"):
        hf_files.read_hf_rows(str(f))


def test_a_prompt_file_that_is_a_device_or_a_fifo_is_refused(tmp_path):
    fifo = tmp_path / "prompt.fifo"
    os.mkfifo(fifo)  # open() would wait for a writer
    for path, expected in [(str(fifo), "not a regular file"), ("/dev/zero", "not a regular file")]:
        line = one_line(DatasetError, lambda p=path: TaskDataSpec("math", prompt_file=p))
        assert line.startswith(f"task 'math' prompt_file = {path!r}: {expected}"), line
    big = tmp_path / "prompt.txt"
    big.write_text("{}" + "x" * (2 << 20))
    line = one_line(DatasetError, lambda: TaskDataSpec("math", prompt_file=str(big)))
    assert "over MAX_PROMPT_FILE_BYTES = 1,048,576" in line


def _weights(tmp_path):
    from safetensors.torch import save_file

    d = tmp_path / "w"
    d.mkdir(parents=True)
    save_file({"a": torch.zeros(64), "b": torch.ones(8, 8)}, str(d / "model.safetensors"))
    return d


def _set_header_length(path, length: int) -> None:
    data = bytearray(path.read_bytes())
    data[:8] = length.to_bytes(8, "little")
    path.write_bytes(bytes(data))


def test_a_safetensors_header_is_checked_against_the_file_size(tmp_path):
    d = _weights(tmp_path)
    f = d / "model.safetensors"
    assert set(weight_shapes(d)) == {"a", "b"} and set(load_weights(d)) == {"a", "b"}
    _set_header_length(f, 2**62)  # read as is, the header would be 4 EiB
    line = one_line(CheckpointError, lambda: weight_shapes(d))
    assert line.startswith(f"checkpoint file {f}: its header claims 4,611,686,018,427,387,904 bytes and the file "
                           "holds")
    d = _weights(tmp_path / "again")
    with open(d / "model.safetensors", "ab") as out:
        out.write(b"\0" * 100)  # padded: the offsets no longer end at the file's end
    line = one_line(CheckpointError, lambda: load_weights(d))
    assert "its header places tensors up to byte" in line and "(truncated or padded)" in line


def test_a_torch_file_whose_records_would_expand_is_refused_before_torch_reads_it(tmp_path):
    good = tmp_path / "state.pt"
    torch.save({"x": torch.zeros(1000)}, good)
    assert load_torch_state(good)["x"].shape == (1000,)
    bomb = tmp_path / "bomb.pt"  # its records, and one more of 64 MiB of zeros deflated to ~64 KB
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bomb, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        dst.writestr("state/data/9", b"\0" * (64 << 20), compress_type=zipfile.ZIP_DEFLATED)
    line = one_line(CheckpointError, lambda: load_torch_state(bomb), peak_mb=16)
    assert line.startswith(f"checkpoint file {bomb}: record ") and "declares 67,108,864 bytes from" in line
