"""JSONL prompt files: parsing, configurable fields, and one-line errors naming file and line."""

import json

import pytest

from rlplane.data import DatasetError, JsonlFields, load_jsonl_dataset
from rlplane.models import build_char_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _write(path, lines):
    path.write_text("\n".join(ln if isinstance(ln, str) else json.dumps(ln) for ln in lines) + "\n")
    return str(path)


def test_loads_rows_into_datums(tok, tmp_path):
    path = _write(tmp_path / "d.jsonl", [
        {"problem": "1+2=", "answer": "3"},
        "",  # blank lines are skipped
        {"problem": "3*4=", "answer": 12, "task_name": "arith2"},
    ])
    ds = load_jsonl_dataset(path, tok)
    assert len(ds) == 2 and ds.num_skipped_overlong == 0
    assert ds[0].message_log[0]["token_ids"] == tok("1+2=")["input_ids"]
    assert ds[0].task_name == "arithmetic" and ds[1].task_name == "arith2"
    assert ds[1].extra_env_info == {"ground_truth": "12"}
    assert [d.idx for d in ds] == [0, 1]


def test_configurable_field_names(tok, tmp_path):
    path = _write(tmp_path / "d.jsonl", [{"q": "5-3=", "a": "2", "env": "x"}])
    ds = load_jsonl_dataset(path, tok, fields=JsonlFields(problem="q", answer="a", task_name="env"))
    assert (ds[0].message_log[0]["content"], ds[0].ground_truth, ds[0].task_name) == ("5-3=", "2", "x")


@pytest.mark.parametrize(
    "lines, fragment",
    [
        ([{"problem": "1+1=", "answer": "2"}, "{not json"], r"d\.jsonl, line 2: not valid JSON"),
        ([{"problem": "1+1=", "answer": "2"}, "", {"problem": "2+2="}], r"d\.jsonl, line 3: missing field "
                                                                        r"'answer' \(row has: problem\)"),
        ([[1, 2]], r"d\.jsonl, line 1: expected a JSON object, got list"),
        (["", "  "], r"d\.jsonl: empty \(no rows\)"),
    ],
)
def test_row_errors_name_file_and_line(tok, tmp_path, lines, fragment):
    path = _write(tmp_path / "d.jsonl", lines)
    with pytest.raises(DatasetError, match=fragment) as e:
        load_jsonl_dataset(path, tok)
    assert "\n" not in str(e.value)


def test_missing_file(tok, tmp_path):
    with pytest.raises(DatasetError, match=r"missing\.jsonl: no such file"):
        load_jsonl_dataset(str(tmp_path / "missing.jsonl"), tok)


def test_overlong_prompts_skip_and_count_or_error(tok, tmp_path):
    path = _write(tmp_path / "d.jsonl", [
        {"problem": "1+1=", "answer": "2"},  # 5 tokens with <bos>
        {"problem": "123456+1=", "answer": "123457"},  # 10 tokens
        {"problem": "2+2=", "answer": "4"},
    ])
    ds = load_jsonl_dataset(path, tok, max_prompt_length=8, on_overlong="skip")
    assert len(ds) == 2 and ds.num_skipped_overlong == 1
    assert [d.idx for d in ds] == [0, 1]
    with pytest.raises(DatasetError, match=r"d\.jsonl, line 2: prompt is 10 tokens, over max_prompt_length = 8"):
        load_jsonl_dataset(path, tok, max_prompt_length=8, on_overlong="error")
    with pytest.raises(DatasetError, match=r"no prompts left \(3 of 3 longer than max_prompt_length = 2\)"):
        load_jsonl_dataset(path, tok, max_prompt_length=2)
