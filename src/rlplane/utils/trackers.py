"""Experiment trackers beside JSONL and TensorBoard: wandb and MLflow (NeMo RL key names), off by default.

Imported only when enabled (``rlplane[trackers]``); a sink has ``log``, ``log_samples``, ``close``. wandb
runs offline with ``WANDB_MODE=offline``; MLflow defaults to ``sqlite:///LOG_DIR/mlflow.db``.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any

from rlplane.errors import ConfigError
from rlplane.utils.reachable import check_server
from rlplane.utils.run_dir import ensure_writable_dir

INSTALL_HINT = "pip install 'rlplane[trackers]'"


def _lazy_import(module: str, key: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError([f"{key}: {module} is not installed; {INSTALL_HINT} (or set {key}=false)"]) from None


def _finite(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (the run config as tracker parameters)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


CONNECT_KEY = "logger.connect_timeout_s"


def _check_tracking_server(url: str, key: str, hint: str, timeout_s: float) -> None:
    """An HTTP(S) tracking server answers within ``timeout_s``: its client would retry for minutes."""
    https = url.startswith("https")
    check_server(url, 443 if https else 80, key, hint, protocol="https" if https else "http", timeout_s=timeout_s,
                 timeout_key=CONNECT_KEY)


class WandbSink:
    def __init__(self, cfg, run_name: str, log_dir: Path, config: dict, connect_timeout_s: float = 30.0):
        self._wandb = _lazy_import("wandb", "logger.wandb_enabled")
        where = Path(cfg.dir) if cfg.dir else log_dir
        ensure_writable_dir(where, "logger.wandb.dir")
        if os.environ.get("WANDB_MODE", "online") not in ("offline", "disabled", "dryrun"):
            _check_tracking_server(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai"), "WANDB_BASE_URL",
                                   "check the network, or log offline with WANDB_MODE=offline", connect_timeout_s)
        try:
            self.run = self._wandb.init(project=cfg.project, name=cfg.name or run_name, entity=cfg.entity,
                                        dir=str(where), config=config,
                                        settings=self._wandb.Settings(init_timeout=connect_timeout_s))
        except Exception as e:  # no login, no network: say what to do instead of a traceback
            raise ConfigError([f"logger.wandb_enabled: wandb.init failed ({type(e).__name__}: {str(e)[:200]}); "
                               "run `wandb login`, or log offline with WANDB_MODE=offline"]) from None

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(_finite(metrics), step=step)

    def log_samples(self, kind: str, step: int, rows: list[dict]) -> None:
        if not rows:
            return
        columns = list(rows[0])
        table = self._wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in rows])
        self.run.log({f"{kind}/samples": table}, step=step)

    def close(self) -> None:
        self.run.finish()


# MLflow keys allow letters, digits, _ - . / space and colon; "pass@4" would be rejected.
_MLFLOW_BAD = re.compile(r"[^\w\-./: ]")


class MlflowSink:
    def __init__(self, cfg, run_name: str, log_dir: Path, config: dict, connect_timeout_s: float = 30.0):
        _lazy_import("mlflow", "logger.mlflow_enabled")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self._Metric = Metric
        uri = cfg.tracking_uri or f"sqlite:///{(log_dir / 'mlflow.db').resolve()}"
        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3 keeps the file store only behind this opt-in.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        if uri.startswith(("http://", "https://")):  # MLflow's client retries a dead server for minutes
            _check_tracking_server(uri, "logger.mlflow.tracking_uri", "start the tracking server or fix the URI "
                                   "(unset: a sqlite store in the log directory)", connect_timeout_s)
        try:
            self.client = MlflowClient(uri)
            exp = self.client.get_experiment_by_name(cfg.experiment_name)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(
                cfg.experiment_name, artifact_location=(log_dir / "mlflow-artifacts").resolve().as_uri())
            self.run_id = self.client.create_run(exp_id, run_name=cfg.run_name or run_name).info.run_id
        except Exception as e:  # a tracking path that cannot be created, a server that is not there
            raise ConfigError([f"logger.mlflow.tracking_uri = {uri!r}: MLflow cannot use it ({type(e).__name__}: "
                               f"{' '.join(str(e).split())[:200]}); point it at a writable path or a running "
                               "server"]) from None
        params = [Param(_MLFLOW_BAD.sub("_", k), str(v)[:500]) for k, v in flatten(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        self.uri = uri

    def log(self, metrics: dict, step: int) -> None:
        now = int(time.time() * 1000)
        batch = [self._Metric(_MLFLOW_BAD.sub("_", k), v, now, step) for k, v in _finite(metrics).items()]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def log_samples(self, kind: str, step: int, rows: list[dict]) -> None:
        if rows:
            text = "".join(json.dumps(r) + "\n" for r in rows)
            self.client.log_text(self.run_id, text, f"samples/{kind}_step_{step}.jsonl")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _wandb_records(run_file: str) -> tuple[list[dict], bool]:
    """History rows (``{"_step": N, ...}``) of a ``run-*.wandb`` file, read without wandb's service.

    LevelDB-style log: 7-byte header, 32 KiB blocks of records (crc32c u32, length u16, type u8: 1 full,
    2 first, 3 middle, 4 last) holding ``wandb.proto`` ``Record`` messages."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    finished = False
    data = Path(run_file).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{run_file}: not a wandb run file (no :W&B header)")
    pos, block, rows, pending = 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            kind_name = record.WhichOneof("record_type")
            if kind_name == "history":
                rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item})
            elif kind_name == "exit":
                finished = True
    return rows, finished


def read_wandb_history(run_file: str, wait_s: float = 30.0) -> list[dict]:
    """History rows of a ``run-*.wandb`` file, waiting up to ``wait_s`` for its exit record (wandb's service
    may still be writing after ``finish()``)."""
    deadline = time.monotonic() + wait_s
    while True:
        rows, finished = _wandb_records(run_file)
        if finished or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def make_trackers(logger_cfg, run_name: str, log_dir: Path, config: dict) -> list:
    """The enabled tracker sinks (none by default)."""
    sinks: list = []
    try:
        if logger_cfg.wandb_enabled:
            sinks.append(WandbSink(logger_cfg.wandb, run_name, log_dir, config, logger_cfg.connect_timeout_s))
        if logger_cfg.mlflow_enabled:
            sinks.append(MlflowSink(logger_cfg.mlflow, run_name, log_dir, config, logger_cfg.connect_timeout_s))
    except BaseException:
        for sink in sinks:  # the first one started: do not leave its run open
            sink.close()
        raise
    return sinks
