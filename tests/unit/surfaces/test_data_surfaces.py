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
