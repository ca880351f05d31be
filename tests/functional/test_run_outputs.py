"""What a short real run leaves behind for its user: sample tables, quiet progress lines without a
terminal, wandb (offline) and MLflow records, and `rlplane plot`'s PNG and HTML of it."""

from __future__ import annotations

import base64
import json
import sys

import numpy as np
import pytest

from rlplane.config.loading import load_config
from rlplane.recipes.grpo import train

for _extra in ("wandb", "mlflow", "matplotlib", "PIL"):
    pytest.importorskip(_extra, reason="rlplane[trackers]")

SHORT = [
    "grpo.num_prompts_per_step=8", "grpo.num_generations_per_prompt=4", "policy.train_global_batch_size=32",
    "policy.train_micro_batch_size=16", "policy.logprob_batch_size=32", "grpo.max_num_steps=4", "grpo.val_period=2",
    "grpo.max_val_samples=16", "grpo.val_batch_size=16", "warmup.num_steps=30", "warmup.target_accuracy=null",
    "warmup.eval_every=30", "warmup.eval_samples=16", "logger.tensorboard_enabled=true", "checkpointing.enabled=false",
    "logger.log_every_n_steps=3", "logger.num_val_samples_to_print=2", "logger.log_train_samples_every=2",
    "logger.wandb_enabled=true", "logger.mlflow_enabled=true", "loss_fn.reference_policy_kl_penalty=0.01",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One short run (4 steps) with every output on; its captured stderr is not a terminal."""
    tmp = tmp_path_factory.mktemp("run")
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_SILENT", "true")
    import io

    err = io.StringIO()  # not a TTY: what a batch job's captured stderr is
    mp.setattr(sys, "stderr", err)
    try:
        summary = train(load_config(None, [*SHORT, f"run_dir={tmp}"]), quiet=False)
    finally:
        mp.undo()
    return tmp, summary, err.getvalue()


def test_samples_jsonl_holds_validation_and_training_samples(run):
    tmp, _, _ = run
    rows = [json.loads(line) for line in (tmp / "logs" / "samples.jsonl").read_text().splitlines()]
    val = [r for r in rows if r["kind"] == "validation"]
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert sorted({r["step"] for r in val}) == [0, 2, 4] and len(val) == 3 * 16  # every held-out problem
    assert sorted({r["step"] for r in train_rows}) == [2, 4] and len(train_rows) == 2 * 32  # every 2nd step
    for r in val:
        assert r["prompt"].endswith("=") and r["reward"] in (0.0, 1.0)
        assert r["reward"] == float(r["completion"].strip() == r["ground_truth"])  # the arithmetic env's score
    for r in train_rows:
        assert set(r) >= {"prompt", "completion", "reward", "advantage", "group"}
    # The logged advantage is the sample's own: with the leave-one-out baseline (the default) its sign is
    # that of r_i - mean_{j != i} r_j over the sample's prompt group (std scaling keeps the sign).
    for step in (2, 4):
        for g in {r["group"] for r in train_rows if r["step"] == step}:
            group = [r for r in train_rows if r["step"] == step and r["group"] == g]
            assert len(group) == 4  # num_generations_per_prompt
            for r in group:
                others = sum(o["reward"] for o in group) - r["reward"]
                centred = r["reward"] - others / 3
                assert np.sign(r["advantage"]) == np.sign(round(centred, 6)), (r, centred)


def test_progress_without_a_terminal_is_plain_lines(run):
    _, _, err = run
    assert "\r" not in err and "%|" not in err  # no progress-bar frames
    lines = [line for line in err.splitlines() if line.startswith("grpo step")]
    # Every 3rd step, each validation (2, 4) and the last: steps 2, 3, 4.
    assert [line.split(" | ")[0] for line in lines] == ["grpo step 2/4", "grpo step 3/4", "grpo step 4/4"]
    assert "val_acc" in lines[0] and "reward" in lines[1] and "s/step" in lines[2]
    # The first 2 validation samples as a table, at each validation.
    assert err.count("validation samples at step") == 3 and "prompt  completion" in err


def test_trackers_hold_the_run(run):
    from mlflow.tracking import MlflowClient

    from rlplane.utils.trackers import read_wandb_history

    tmp, summary, _ = run
    (run_file,) = (tmp / "logs" / "wandb").glob("offline-run-*/run-*.wandb")
    history = read_wandb_history(str(run_file))
    assert [r["_step"] for r in history if "train/reward" in r] == [1, 2, 3, 4]
    assert [r["validation/accuracy"] for r in history if "validation/accuracy" in r][-1] == summary["accuracy_after"]
    client = MlflowClient(f"sqlite:///{tmp / 'logs' / 'mlflow.db'}")
    (mlrun,) = client.search_runs([client.get_experiment_by_name("rlplane").experiment_id])
    acc = client.get_metric_history(mlrun.info.run_id, "validation/accuracy")
    assert [m.step for m in acc] == [0, 2, 4] and acc[-1].value == summary["accuracy_after"]
    assert {a.path for a in client.list_artifacts(mlrun.info.run_id, "samples")} >= {
        "samples/validation_step_2.jsonl", "samples/train_step_2.jsonl"}


def test_plot_renders_every_panel(run, tmp_path):
    from PIL import Image

    from rlplane.cli import main
    from rlplane.utils.plot import figures, load_run

    tmp, _, _ = run
    assert main(["plot", str(tmp), str(tmp), "-o", str(tmp_path / "p.png")]) == 0  # two runs overlaid
    img = np.asarray(Image.open(tmp_path / "p.png").convert("RGB")).astype(int)
    h, w = img.shape[:2]
    assert (h, w, img.shape[2]) == (1200, 1800, 3)
    grid, singles = figures([load_run(tmp)])
    titles = [ax.get_title() for ax in grid.axes]
    assert len(titles) == 9 and any("KL" in t for t in titles) and any("per phase" in t for t in titles)
    assert any("clip" in t for t in titles) and any("within groups" in t for t in titles)
    for ax in grid.axes:
        # Data lines are coloured; frame, grid and text are grey. Coloured pixels inside each panel's
        # box (figure fractions -> pixels, y from the top) mean the panel drew its series.
        box = ax.get_position()
        x0, x1 = int(box.x0 * w), int(box.x1 * w)
        y0, y1 = int((1 - box.y1) * h), int((1 - box.y0) * h)
        panel = img[y0:y1, x0:x1]
        coloured = (panel.max(axis=2) - panel.min(axis=2) > 60).sum()
        assert coloured > 200 and panel.std() > 10, (ax.get_title(), coloured)
        assert all(np.isfinite(line.get_ydata()).all() for line in ax.get_lines()) and ax.get_lines()
    page = (tmp_path / "p.html").read_text()
    images = page.split('src="data:image/png;base64,')[1:]
    assert len(images) == len(singles) == 9
    assert all(base64.b64decode(s.split('"')[0])[:8] == b"\x89PNG\r\n\x1a\n" for s in images)
