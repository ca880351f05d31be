"""Model and dataset mistakes through the `rlplane` command: exit status 2, one line, no traceback."""

from __future__ import annotations

import json

import pytest

from rlplane.cli import main


@pytest.fixture(autouse=True)
def _own_working_directory(tmp_path, monkeypatch):
    """The default run_dir is relative: a test process of its own (pytest -n) must not share it."""
    monkeypatch.chdir(tmp_path)

def run(capsys, *argv):
    rc = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err.strip().splitlines()


def one_line(capsys, fragment, *argv):
    rc, lines = run(capsys, *argv)
    assert rc == 2 and len(lines) == 1 and fragment in lines[0], lines


def test_model_path_that_does_not_exist(capsys, tmp_path):
    missing = tmp_path / "no-model"
    one_line(capsys, f"model_name='{missing}': no such directory", "train", f"policy.model_name={missing}")


def test_hub_id_offline(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    one_line(capsys, "not in the local Hugging Face cache, and the hub is offline (HF_HUB_OFFLINE=1)",
             "train", "policy.model_name=someorg/not-cached-model")


def test_dataset_without_the_configured_fields(capsys, tmp_path):
    f = tmp_path / "qa.jsonl"
    f.write_text(json.dumps({"question": "1+1=", "solution": "2"}) + "\n")
    one_line(capsys, "line 1: missing field 'problem' (row has: question, solution)",
             "train", "data.dataset=jsonl", f"data.train.path={f}")
    pytest.importorskip("datasets", reason="needs the hf extra")
    one_line(capsys, "no column 'answer' (columns: question, solution); set data.train.answer_key",
             "train", "data.dataset=hf", f"data.train.path={f}", "data.train.problem_key=question")


def test_unknown_task_name(capsys, tmp_path):
    f = tmp_path / "mixed.jsonl"
    f.write_text(json.dumps({"problem": "1+1=", "answer": "2", "task_name": "chess"}) + "\n")
    one_line(capsys, "task_name 'chess' has no environment (known: arithmetic, "
                     "calculator, code, guess_number, math, math_multi_reward, reasoning_gym",
             "train", "data.dataset=jsonl", f"data.train.path={f}")


def test_eval_and_export_mistakes(capsys, tmp_path):
    one_line(capsys, "no such directory", "eval", "--checkpoint", str(tmp_path / "nope"))
    one_line(capsys, "no model there", "eval", "--checkpoint", str(tmp_path))
    one_line(capsys, "exactly one of --checkpoint DIR or --model NAME", "eval")
    one_line(capsys, "--dataset 'nope': not a file", "eval", "--model", "embedded:tiny-llama", "--dataset", "nope")
    one_line(capsys, "no model there", "export", "--checkpoint", str(tmp_path), "--output", str(tmp_path / "out"))
