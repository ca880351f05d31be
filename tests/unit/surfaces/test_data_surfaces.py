"""JSONL reference answers: non-empty strings or numbers, else one line naming the file and the row."""

from __future__ import annotations

import pytest

from rlplane.data.errors import DatasetError
from rlplane.data.jsonl import read_jsonl_rows


@pytest.mark.parametrize("answer, shown", [
    ("null", "null (NoneType)"),  # used to become the answer "None"
    ('{"x": 1}', '{"x": 1} (dict)'),  # its repr
    ("[1, 2]", "[1, 2] (list)"),
    ("true", "true (bool)"),
    ('""', "an empty string"),  # an empty completion scored 1
    ('"   "', "an empty string"),
    ("NaN", "NaN (float)"),  # Python's json reads it
])
def test_an_answer_that_is_not_text_or_a_number_is_refused(tmp_path, answer, shown):
    f = tmp_path / "d.jsonl"
    f.write_text('{"problem": "1+1=", "answer": "2"}\n' + f'{{"problem": "2+2=", "answer": {answer}}}\n')
    with pytest.raises(DatasetError) as e:
        read_jsonl_rows(str(f))
    assert str(e.value) == (f"dataset {f}, line 2: field 'answer' is {shown}; the reference answer must be a "
                            "non-empty string or a number")


def test_numbers_and_strings_are_answers(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"problem": "a", "answer": 4}\n{"problem": "b", "answer": 2.5}\n{"problem": "c", "answer": "x"}\n')
    assert [r["answer"] for r in read_jsonl_rows(str(f))] == ["4", "2.5", "x"]


HF_ANSWERS = [("null", "null (NoneType)"), ('{"x": 1}', '{"x": 1} (dict)'), ("[1, 2]", "[1, 2] (list)"),
              ("true", "true (bool)"), ('""', "an empty string")]


@pytest.mark.parametrize("answer, shown", HF_ANSWERS)
def test_hf_json_answers_get_the_same_checks(tmp_path, answer, shown):
    """The hf loader turned them into their Python repr ("None", "{'x': 1}") and scored against that."""
    pytest.importorskip("datasets")
    from rlplane.data.hf_files import read_hf_rows

    f = tmp_path / "d.json"
    f.write_text(f'{{"problem": "1+1=", "answer": {answer}}}\n')
    with pytest.raises(DatasetError) as e:
        read_hf_rows(str(f))
    assert str(e.value) == (f"dataset {f}, row 1: field 'answer' is {shown}; the reference answer must be a "
                            "non-empty string or a number")


@pytest.mark.parametrize("cells", ["a,x\nb,\n", "a,2.5\nb,\n"], ids=["text-column", "number-column"])
def test_an_empty_csv_cell_is_no_answer(tmp_path, cells):
    pytest.importorskip("datasets")
    from rlplane.data.hf_files import read_hf_rows

    f = tmp_path / "d.csv"
    f.write_text("problem,answer\n" + cells)
    with pytest.raises(DatasetError, match=r", row 2: field 'answer' is null \(NoneType\); the reference answer must"):
        read_hf_rows(str(f))


def test_hf_parquet_rows_with_a_bad_answer_name_the_row(tmp_path):
    pytest.importorskip("datasets")
    import datasets

    from rlplane.data.hf_files import read_hf_rows

    f = tmp_path / "d.parquet"
    datasets.Dataset.from_dict({"problem": ["a", "b", "c"], "answer": [[1], [2], []]}).to_parquet(str(f))
    with pytest.raises(DatasetError, match=r"row 1: field 'answer' is \[1\] \(list\)"):
        read_hf_rows(str(f))


def test_hf_strings_and_numbers_are_answers(tmp_path):
    pytest.importorskip("datasets")
    from rlplane.data.hf_files import read_hf_rows

    f = tmp_path / "d.csv"
    f.write_text("problem,answer\na,4\nb,x\n")
    assert [r["answer"] for r in read_hf_rows(str(f))] == ["4", "x"]
