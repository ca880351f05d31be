"""Bad input through the `rlplane` command: exit status 2, one line per problem, no traceback."""

from __future__ import annotations

import pytest

from rlplane.cli import main


@pytest.fixture(autouse=True)
def _own_working_directory(tmp_path, monkeypatch):
    """The default run_dir is relative: a test process of its own (pytest -n) must not share it."""
    monkeypatch.chdir(tmp_path)

def run(capsys, *argv):
    rc = main(["train", *argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err.strip().splitlines()


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["grpo.num_prompt_per_step=3"], "grpo.num_prompt_per_step: unknown key; did you mean "
                                         "grpo.num_prompts_per_step?"),
        (["policy.optimizer.lr=abc"], "policy.optimizer.lr: Input should be a valid number"),
        (["loss_fn.use_cispo=true", "loss_fn.ratio_clip_c=3"], "CISPO has no dual clip"),
        (["--config", "nope"], "config 'nope': no such file or preset"),
        (["grpo.async_grpo.enabled=true"], "grpo.async_grpo.enabled needs "
                                           "loss_fn.use_importance_sampling_correction=true"),
        (["--config", "grpo_arithmetic_async", "grpo.use_dynamic_sampling=true"],
         "grpo.use_dynamic_sampling cannot run with grpo.async_grpo.enabled"),
    ],
)
def test_config_mistakes(capsys, argv, expected):
    rc, lines = run(capsys, *argv)
    assert rc == 2 and len(lines) == 1 and expected in lines[0]


def test_dataset_mistakes(capsys, tmp_path):
    missing = tmp_path / "missing.jsonl"
    rc, lines = run(capsys, "data.dataset=jsonl", f"data.train.path={missing}")
    assert rc == 2 and lines == [f"rlplane: error: dataset {missing}: no such file"]

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "1+1=", "answer": "2"}\n{"question": "2+2="}\n')
    rc, lines = run(capsys, "data.dataset=jsonl", f"data.train.path={bad}")
    assert rc == 2 and len(lines) == 1 and "line 2: missing field 'problem'" in lines[0]

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    rc, lines = run(capsys, "data.dataset=jsonl", f"data.train.path={empty}")
    assert rc == 2 and len(lines) == 1 and "empty" in lines[0]

    long = tmp_path / "long.jsonl"
    long.write_text('{"problem": "1+1=", "answer": "2"}\n{"problem": "' + "1" * 40 + '+1=", "answer": "2"}\n')
    rc, lines = run(capsys, "data.dataset=jsonl", f"data.train.path={long}", "data.on_overlong_prompt=error")
    assert rc == 2 and len(lines) == 1 and "line 2: prompt is" in lines[0]
