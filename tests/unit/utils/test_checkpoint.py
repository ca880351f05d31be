"""Checkpoints across nodes and for real models (issue 16, item 12): absolute paths handed to the
workers, sharded weights, the re-save window, fsync before rename; and the metrics of a resume."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from rlplane.config.loading import load_config
from rlplane.utils.checkpoint import CheckpointError, CheckpointManager, load_weights, weight_files
from rlplane.utils.logging import MetricsLogger, read_metrics
from tests.tiny import TINY_RUN

TINY = [*TINY_RUN, "policy.tiny.num_layers=2"]


def session(run_dir, *extra):
    from rlplane.training import Session

    return Session(load_config(None, [*TINY, f"run_dir={run_dir}", *extra]), quiet=True)


def fill(value: str):
    def write(tmp: Path) -> None:
        (tmp / "payload.txt").write_text(value)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "inner.bin").write_bytes(value.encode())

    return write


def test_workers_are_handed_absolute_checkpoint_paths(tmp_path, monkeypatch):
    """A Ray actor's cwd is not the driver's (nor its node): a relative path lands in the wrong place."""
    from rlplane.workers.policy import PolicyWorker

    seen = []
    real_save = PolicyWorker.save
    def save(self, path):  # named as the method it stands in for: calls name the worker's method
        seen.append(path)
        return real_save(self, path)

    monkeypatch.setattr(PolicyWorker, "save", save)
    monkeypatch.chdir(tmp_path)
    s = session("rel-run")
    try:
        s.start()
        monkeypatch.chdir("/")  # where a worker process may well run
        saved = s.save_checkpoint(1, {})
    finally:
        s.close()
    assert seen and all(os.path.isabs(p) for p in seen)
    assert saved == tmp_path / "rel-run" / "checkpoints" / "step_1"
    assert (saved / "policy" / "weights" / "config.json").is_file()


def test_sharded_weights_load_and_resume(tmp_path):
    """save_pretrained shards big models (model-0000k-of-0000n.safetensors + an index); resume loads them."""
    s = session(tmp_path / "run")
    try:
        s.start()
        ckpt = s.save_checkpoint(1, {})
        model = s.workers.policy.workers[0].model
        weights = ckpt / "policy" / "weights"
        (weights / "model.safetensors").unlink()
        model.save_pretrained(weights, max_shard_size="2KB")
        expected = {k: v.clone() for k, v in model.state_dict().items()}
    finally:
        s.close()
    shards = weight_files(weights)
    assert len(shards) > 1 and (weights / "model.safetensors.index.json").is_file()
    loaded = load_weights(weights)
    assert all(torch.equal(loaded[k], expected[k]) for k in loaded)

    s = session(tmp_path / "run", "checkpointing.resume=true")
    try:
        assert s.start() == 1
        got = s.workers.policy.workers[0].model.state_dict()
        assert all(torch.equal(got[k], expected[k]) for k in expected)
    finally:
        s.close()


def test_damaged_index_or_missing_shard_is_a_checkpoint_error(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {"a": "model-00001-of-00002.safetensors"}}')
    with pytest.raises(CheckpointError, match="shard model-00001-of-00002.safetensors named in"):
        weight_files(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="index.json is damaged"):
        weight_files(tmp_path)


def test_prune_cut_mid_delete_leaves_no_half_checkpoint(tmp_path, monkeypatch):
    """A kill while retention deletes a checkpoint (issue 20): rmtree had already removed its
    training_info.json, so every later save's ranking read that half directory and stopped the run."""
    m = CheckpointManager(tmp_path, keep_top_k=1, metric_name="val:accuracy", higher_is_better=True)
    m.save(1, {"step": 1, "metrics": {"val:accuracy": 0.1}}, fill("one"))

    def killed_mid_delete(path, *args, **kwargs):  # the first file went, then the kill
        (Path(path) / "training_info.json").unlink()
        raise KeyboardInterrupt("killed")

    real_rmtree = shutil.rmtree
    monkeypatch.setattr(shutil, "rmtree", killed_mid_delete)
    with pytest.raises(KeyboardInterrupt):
        m.save(2, {"step": 2, "metrics": {"val:accuracy": 0.2}}, fill("two"))  # keep_top_k=1: step_1 goes
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)

    fresh = CheckpointManager(tmp_path, keep_top_k=1, metric_name="val:accuracy", higher_is_better=True)
    assert fresh.steps() == [2]  # the half-deleted step_1 is no checkpoint
    fresh.repair()
    fresh.save(3, {"step": 3, "metrics": {"val:accuracy": 0.3}}, fill("three"))  # ranks every checkpoint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_3"]


def test_resave_cut_between_its_renames_keeps_the_newest_checkpoint(tmp_path, monkeypatch):
    m = CheckpointManager(tmp_path, keep_top_k=None, metric_name="val:accuracy", higher_is_better=True)
    m.save(1, {"step": 1}, fill("one"))
    m.save(2, {"step": 2}, fill("two, first save"))

    real_rename = Path.rename
    calls = []

    def crash_on_second(self, target):
        calls.append(Path(target).name)
        if len(calls) == 2:  # step_2 -> old_step_2 happened; tmp_step_2 -> step_2 did not
            raise KeyboardInterrupt("killed")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        m.save(2, {"step": 2}, fill("two, second save"))
    monkeypatch.setattr(Path, "rename", real_rename)
    assert calls == ["old_step_2", "step_2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old_step_2", "step_1", "tmp_step_2"]

    fresh = CheckpointManager(tmp_path, keep_top_k=None, metric_name="val:accuracy", higher_is_better=True)
    assert fresh.latest() == tmp_path / "old_step_2"  # eval/export already see it as the newest
    done = fresh.repair()
    assert any("restored old_step_2" in d for d in done)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1", "step_2"]
    assert fresh.latest() == tmp_path / "step_2"
    assert (tmp_path / "step_2" / "payload.txt").read_text() == "two, first save"
    assert fresh.load_info(fresh.latest())["step"] == 2


def test_every_file_and_directory_is_fsynced_before_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_rename = os.fsync, Path.rename
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 real_fsync(fd))[1])
    monkeypatch.setattr(Path, "rename", lambda self, t: (events.append(("rename", str(self))), real_rename(self, t))[1])
    m = CheckpointManager(tmp_path, keep_top_k=None, metric_name="val:accuracy", higher_is_better=True)
    m.save(3, {"step": 3}, fill("x"))
    tmp = str(tmp_path / "tmp_step_3")
    rename_at = events.index(("rename", tmp))
    before = {p for kind, p in events[:rename_at] if kind == "fsync"}
    for rel in ("payload.txt", "sub/inner.bin", "training_info.json", "sub", ""):
        assert os.path.normpath(os.path.join(tmp, rel)) in before, rel
    assert ("fsync", str(tmp_path)) in events[rename_at:]  # the rename itself made durable


def test_resume_drops_the_metrics_rows_of_the_killed_stretch(tmp_path):
    log = MetricsLogger(tmp_path, jsonl=True, tensorboard=False)
    for step in range(6):
        log.log({"x": step}, step)
    log.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "x": ')  # the row the kill cut in half
    log = MetricsLogger(tmp_path, jsonl=True, tensorboard=False)
    assert log.drop_after(3) == 3  # steps 4, 5 and the cut row
    log.log({"x": 40}, 4)
    log.close()
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4] and rows[-1]["x"] == 40


def test_resume_drops_the_prompt_and_sample_rows_of_the_killed_stretch(tmp_path):
    """prompts.jsonl (what each step trained on, issue 20) and samples.jsonl go back to the checkpoint
    like metrics.jsonl: a redone step must not show its prompts or samples twice."""
    log = MetricsLogger(tmp_path, jsonl=True, tensorboard=False)
    for step in range(1, 6):
        log.log({"x": step}, step)
        log.log_prompts(step, {"drawn": [[0, step]], "trained": [[0, step]]})
        log.log_samples("train", step, [{"prompt": f"p{step}"}])
    log.close()
    log = MetricsLogger(tmp_path, jsonl=True, tensorboard=False)
    assert log.drop_after(3) == 2
    log.log_prompts(4, {"drawn": [[0, 40]], "trained": [[0, 40]]})
    log.close()
    prompts = [json.loads(line) for line in (tmp_path / "prompts.jsonl").read_text().splitlines()]
    assert [(r["step"], r["drawn"]) for r in prompts] == [(1, [[0, 1]]), (2, [[0, 2]]), (3, [[0, 3]]), (4, [[0, 40]])]
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in samples] == [1, 2, 3]


def test_resumed_run_logs_each_step_once(tmp_path):
    from rlplane.recipes.grpo import train

    run = tmp_path / "run"
    train(load_config(None, [*TINY, f"run_dir={run}", "grpo.max_num_steps=3"]), quiet=True)
    # Killed after step 3 was logged but before a later checkpoint: step_3 exists; pretend it did not.
    import shutil

    shutil.rmtree(run / "checkpoints" / "step_3")
    train(load_config(None, [*TINY, f"run_dir={run}", "grpo.max_num_steps=3", "checkpointing.resume=true"]),
          quiet=True)
    steps = [r["step"] for r in read_metrics(run / "logs")]
    assert steps == [1, 2, 3]
    prompts = [json.loads(line) for line in (run / "logs" / "prompts.jsonl").read_text().splitlines()]
    assert [r["step"] for r in prompts] == [1, 2, 3] and all(len(r["trained"]) == 2 for r in prompts)
    assert json.loads((run / "checkpoints" / "step_3" / "training_info.json").read_text())["step"] == 3


def test_a_worker_s_torch_save_on_a_full_disk_is_named_as_such(tmp_path, monkeypatch):
    """torch.save's zip writer on a full disk raises RuntimeError("... unexpected pos ..."), under Ray wrapped
    with the error as ``cause``: still the one "No space left" line, and no half checkpoint."""

    class Wrapped(RuntimeError):
        cause = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    def write(d):
        (d / "part").write_text("x")
        raise Wrapped("ray task error")

    manager = CheckpointManager(tmp_path, None, "val:accuracy", True)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(1 << 30, 1 << 30, 4096))
    with pytest.raises(CheckpointError, match=r"tmp_step_2: cannot write it \(No space left on device\)"):
        manager.save(2, {"step": 2}, write)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()  # plenty of space: another error, raised as it is
    with pytest.raises(Wrapped):
        manager.save(2, {"step": 2}, write)
    assert list(tmp_path.iterdir()) == []
