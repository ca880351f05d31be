"""Metric sinks: JSONL (one object per step) and TensorBoard; a progress bar on stderr."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


class MetricsLogger:
    def __init__(self, log_dir: str | Path, jsonl: bool = True, tensorboard: bool = True):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(self.log_dir / "metrics.jsonl", "a") if jsonl else None
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.log_dir / "tensorboard"))
            except ImportError:  # tensorboard is a dependency, but a trimmed install may lack it
                print("rlplane: tensorboard not installed; logging to JSONL only", file=sys.stderr)

    def drop_after(self, step: int) -> int:
        """Forget every logged row past ``step`` (a resumed run redoes those steps): rewrite
        ``metrics.jsonl`` without them and reopen TensorBoard purging its events past ``step``.
        Returns how many JSONL rows went."""
        dropped = 0
        if self._jsonl is not None:
            self._jsonl.close()
            path = self.log_dir / "metrics.jsonl"
            lines = path.read_text().splitlines(keepends=True)
            kept = [line for line in lines if not line.strip() or _row_step(line) <= step]
            dropped = len(lines) - len(kept)
            if dropped:
                tmp = path.with_suffix(".jsonl.tmp")
                tmp.write_text("".join(kept))
                tmp.replace(path)
            self._jsonl = open(path, "a")
        if self._tb is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb.close()
            self._tb = SummaryWriter(str(self.log_dir / "tensorboard"), purge_step=step + 1)
        return dropped

    def log(self, metrics: dict[str, float], step: int) -> None:
        clean = {k: (float(v) if isinstance(v, (int, float)) else v) for k, v in metrics.items()}
        if self._jsonl is not None:
            row = {"step": step, **{k: (v if not (isinstance(v, float) and not math.isfinite(v)) else str(v)) for k, v in clean.items()}}
            self._jsonl.write(json.dumps(row) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            for k, v in clean.items():
                if isinstance(v, float) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
        if self._tb is not None:
            self._tb.close()


def _row_step(line: str) -> float:
    try:
        return float(json.loads(line).get("step", math.inf))
    except (ValueError, AttributeError):  # a row cut by the kill: it goes too
        return math.inf


def read_metrics(log_dir: str | Path) -> list[dict]:
    with open(Path(log_dir) / "metrics.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]
