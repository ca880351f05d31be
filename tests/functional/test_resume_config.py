"""Resume with a changed config, through ``rlplane train``: a change of the prompts per step is converted
(the epoch goes on at its next draw: ``logs/prompts.jsonl`` names every prompt of the epoch once), a
free change takes effect (the learning rate), a refused one stops the run in one line before any step.

The job: the embedded tiny model, no warm-up, 32 training prompts, 2 steps of 4 prompts × 4 generations
with a checkpoint at each step; each test resumes a copy of that run. The runs are the CLI's, in this process.
"""

from __future__ import annotations

import io
import json
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlplane.cli import main
from rlplane.config.loading import load_config
from rlplane.workers.trainer import lr_factor

NUM_PROMPTS = 32
ARGS = [
    "warmup.enabled=false", "grpo.num_generations_per_prompt=4", "policy.train_global_batch_size=4",
    "policy.train_micro_batch_size=4", "policy.logprob_batch_size=4", "grpo.val_at_start=false",
    "grpo.val_period=0", "grpo.val_at_end=false", "grpo.max_val_samples=4", "grpo.val_batch_size=4",
    f"data.num_train_samples={NUM_PROMPTS}", "logger.tensorboard_enabled=false", "logger.progress_bar=false",
    "checkpointing.save_period=1", "checkpointing.keep_top_k=1",
]


def train(run_dir: Path, *overrides: str) -> SimpleNamespace:
    """``rlplane train`` (``rlplane.cli.main``, in this process: no interpreter to start per run), resuming in
    ``run_dir``: its exit status and what it wrote to stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            rc = main(["train", *ARGS, *overrides, f"run_dir={run_dir}", "checkpointing.resume=true"])
        except SystemExit as e:
            rc = e.code
    return SimpleNamespace(returncode=rc, stdout=out.getvalue(), stderr=err.getvalue())


def rows(run_dir: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "logs" / name).read_text().splitlines()]


@pytest.fixture(scope="module")
def first_two_steps(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("resume") / "base"
    done = train(run_dir, "grpo.num_prompts_per_step=4", "grpo.max_num_steps=2")
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


def resumed_copy(first_two_steps: Path, tmp_path: Path, *overrides: str) -> tuple[Path, SimpleNamespace]:
    run_dir = tmp_path / "run"
    shutil.copytree(first_two_steps, run_dir)
    return run_dir, train(run_dir, *overrides)


@pytest.mark.parametrize("per_step", [3, 8])
def test_new_prompts_per_step_trains_each_prompt_of_the_epoch_once(first_two_steps, tmp_path, per_step):
    # 8 prompts drawn at 4 per step; the 24 left are 8 steps of 3 or 3 steps of 8.
    steps = 2 + (NUM_PROMPTS - 8) // per_step
    run_dir, done = resumed_copy(first_two_steps, tmp_path, f"grpo.num_prompts_per_step={per_step}",
                                 f"grpo.max_num_steps={steps}")
    assert done.returncode == 0, done.stderr[-3000:]
    log = done.stdout + done.stderr  # the run's messages go to stderr beside its progress
    assert f"resume: grpo.num_prompts_per_step: 4 -> {per_step} (convertible)" in log
    assert f"resume: prompts per batch 4 -> {per_step}: epoch 0 continues at its prompt 9 of {NUM_PROMPTS}" in log
    ledger = rows(run_dir, "prompts.jsonl")
    assert [r["step"] for r in ledger] == list(range(1, steps + 1))
    assert [len(r["trained"]) for r in ledger] == [4, 4] + [per_step] * (steps - 2)
    trained = [tuple(p) for r in ledger for p in r["trained"]]
    assert all(epoch == 0 for epoch, _ in trained)
    assert sorted(idx for _, idx in trained) == list(range(NUM_PROMPTS))  # each prompt once, none left out


def test_free_change_takes_effect(first_two_steps, tmp_path):
    run_dir, done = resumed_copy(first_two_steps, tmp_path, "grpo.num_prompts_per_step=4", "grpo.max_num_steps=3",
                                 "policy.optimizer.lr=1e-05")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resume: policy.optimizer.lr: 0.0002 -> 1e-05 (free)" in done.stdout + done.stderr
    lrs = {r["step"]: r["train/lr"] for r in rows(run_dir, "metrics.jsonl") if "train/lr" in r}
    # The preset's schedule (a cosine fall over 1000 steps) goes on where it was, from the new base lr:
    # step s trains at lr · lr_factor(s), 1 - 0.9·(πs/1000)²/4 ≈ 0.99999 for s <= 3.
    schedule = load_config(None).policy.scheduler
    assert schedule.decay == "cosine"
    assert lrs == pytest.approx({1: 2e-4 * lr_factor(1, schedule), 2: 2e-4 * lr_factor(2, schedule),
                                 3: 1e-5 * lr_factor(3, schedule)}, rel=1e-9)


def test_refused_change_stops_before_any_step(first_two_steps, tmp_path):
    run_dir, done = resumed_copy(first_two_steps, tmp_path, "grpo.num_prompts_per_step=4", "grpo.max_num_steps=3",
                                 "data.shuffle=false")
    assert done.returncode == 2
    step_2 = run_dir.resolve() / "checkpoints" / "step_2"
    assert done.stderr.strip().splitlines() == [
        f"rlplane: error: resume from {step_2}: data.shuffle: true there, false now: a resumed run cannot change it "
        "(it changes the training prompts the saved position points into); set data.shuffle=true to resume, or "
        "start a new run_dir"]
    assert [r["step"] for r in rows(run_dir, "prompts.jsonl")] == [1, 2]
