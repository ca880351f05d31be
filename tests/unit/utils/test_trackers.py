"""wandb (offline) and MLflow (sqlite store) sinks: metrics and samples logged for real, read back
from what each tool wrote (wandb's run file; MLflow through its own client)."""

from __future__ import annotations

import glob
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("wandb", reason="rlplane[trackers]")
pytest.importorskip("mlflow", reason="rlplane[trackers]")

from rlplane.config.loading import ConfigError
from rlplane.config.logger import LoggerConfig
from rlplane.utils.trackers import flatten, make_trackers, read_wandb_history

CONFIG = {"grpo": {"num_prompts_per_step": 32, "seed": 42}, "policy": {"optimizer": {"lr": 2e-4}}}
METRICS = [{"train/reward": 0.25, "validation/pass@4": 0.5}, {"train/reward": 0.5}, {"train/reward": 0.75}]


def test_wandb_offline_run_holds_the_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = LoggerConfig(wandb_enabled=True, wandb={"project": "rlplane-test", "dir": str(tmp_path)})
    (sink,) = make_trackers(cfg, "my-run", tmp_path / "logs", CONFIG)
    for step, m in enumerate(METRICS, start=1):
        sink.log({**m, "note": "text is skipped", "bad": float("nan")}, step)
    sink.log_samples("validation", 3, [{"prompt": "1+2=", "completion": "3", "reward": 1.0}])
    sink.close()
    (run_file,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    history = read_wandb_history(run_file)
    rewards = [(r["_step"], r["train/reward"]) for r in history if "train/reward" in r]
    assert rewards == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert history[0]["validation/pass@4"] == 0.5 and all("bad" not in r and "note" not in r for r in history)
    (table,) = [r for r in history if r.get("validation/samples/_type") == "table-file"]
    assert table["_step"] == 3  # the samples sit beside the step's metrics
    saved = json.loads((Path(run_file).parent / "files" / table["validation/samples/path"]).read_text())
    assert saved["columns"] == ["prompt", "completion", "reward"] and saved["data"] == [["1+2=", "3", 1.0]]


def test_mlflow_sqlite_store_read_back_with_mlflow_client(tmp_path):
    from mlflow.tracking import MlflowClient

    cfg = LoggerConfig(mlflow_enabled=True, mlflow={"experiment_name": "rlplane-test"})
    (sink,) = make_trackers(cfg, "my-run", tmp_path / "logs", CONFIG)
    for step, m in enumerate(METRICS, start=1):
        sink.log(m, step)
    sink.log_samples("validation", 3, [{"prompt": "1+2=", "completion": "3", "reward": 1.0}])
    sink.close()
    assert sink.uri == f"sqlite:///{(tmp_path / 'logs' / 'mlflow.db').resolve()}"  # the default store
    client = MlflowClient(sink.uri)
    run = client.get_run(sink.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "my-run"
    history = client.get_metric_history(sink.run_id, "train/reward")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert client.get_metric_history(sink.run_id, "validation/pass_4")[0].value == 0.5  # '@' is not allowed
    assert run.data.params["grpo.num_prompts_per_step"] == "32" and run.data.params["policy.optimizer.lr"] == "0.0002"
    local = client.download_artifacts(sink.run_id, "samples/validation_step_3.jsonl", str(tmp_path))
    assert json.loads(open(local).read()) == {"prompt": "1+2=", "completion": "3", "reward": 1.0}


@pytest.mark.parametrize("key, module", [("wandb_enabled", "wandb"), ("mlflow_enabled", "mlflow")])
def test_missing_package_gives_the_install_hint(tmp_path, monkeypatch, key, module):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError
    hint = rf"^logger.{key}: {module} is not installed; pip install 'rlplane\[trackers\]'"
    with pytest.raises(ConfigError, match=hint):
        make_trackers(LoggerConfig(**{key: True}), "r", tmp_path, {})


def test_off_by_default_and_flatten():
    assert make_trackers(LoggerConfig(), "r", None, {}) == []
    assert flatten({"a": {"b": 1, "c": {"d": None}}, "e": []}) == {"a.b": 1, "a.c.d": None, "e": []}
