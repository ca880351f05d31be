"""Metric sinks (JSONL, TensorBoard, trackers), sample tables, per-step prompts, and progress on stderr."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


class MetricsLogger:
    def __init__(self, log_dir: str | Path, jsonl: bool = True, tensorboard: bool = True, sinks: list | None = None):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(self.log_dir / "metrics.jsonl", "a") if jsonl else None
        self._samples = None  # samples.jsonl, opened on the first table
        self._prompts = None  # prompts.jsonl, opened on the first step
        self.sinks = list(sinks or [])
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.log_dir / "tensorboard"))
            except ImportError:  # tensorboard is a dependency, but a trimmed install may lack it
                print("rlplane: tensorboard not installed; logging to JSONL only", file=sys.stderr)

    def drop_after(self, step: int) -> int:
        """Forget every row past ``step`` (a resume redoes them) in the JSONL files and TensorBoard; returns
        how many ``metrics.jsonl`` rows went."""
        dropped = 0
        if self._jsonl is not None:
            self._jsonl.close()
            dropped = _drop_rows_after(self.log_dir / "metrics.jsonl", step)
            self._jsonl = open(self.log_dir / "metrics.jsonl", "a")
            for f in (self._prompts, self._samples):
                if f is not None:
                    f.close()
            self._prompts = self._samples = None  # reopened on their next row
            for name in ("prompts.jsonl", "samples.jsonl"):
                _drop_rows_after(self.log_dir / name, step)
        if self._tb is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb.close()
            self._tb = SummaryWriter(str(self.log_dir / "tensorboard"), purge_step=step + 1)
        return dropped

    def log(self, metrics: dict[str, float], step: int) -> None:
        clean = {k: (float(v) if isinstance(v, (int, float)) else v) for k, v in metrics.items()}
        if self._jsonl is not None:
            row = {"step": step, **{k: (v if not (isinstance(v, float) and not math.isfinite(v)) else str(v)) for k,
                                    v in clean.items()}}
            self._jsonl.write(json.dumps(row) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            for k, v in clean.items():
                if isinstance(v, float) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
        for sink in self.sinks:
            sink.log(clean, step)

    def log_prompts(self, step: int, record: dict) -> None:
        """Append ``{"step": step, **record}`` to ``prompts.jsonl`` (with the JSONL sink only)."""
        if self._jsonl is None:
            return
        if self._prompts is None:
            self._prompts = open(self.log_dir / "prompts.jsonl", "a")
        self._prompts.write(json.dumps({"step": step, **record}) + "\n")
        self._prompts.flush()

    def log_samples(self, kind: str, step: int, rows: list[dict]) -> None:
        """Append ``rows`` to ``samples.jsonl`` as ``{"kind", "step", ...}``, TensorBoard and the trackers."""
        if not rows:
            return
        if self._samples is None:
            self._samples = open(self.log_dir / "samples.jsonl", "a")
        for r in rows:
            self._samples.write(json.dumps({"kind": kind, "step": step, **r}) + "\n")
        self._samples.flush()
        if self._tb is not None:
            self._tb.add_text(f"{kind}/samples", markdown_table(rows[:64]), step)
        for sink in self.sinks:
            sink.log_samples(kind, step, rows)

    def close(self) -> None:
        for f in (self._jsonl, self._samples, self._prompts):
            if f is not None:
                f.close()
        if self._tb is not None:
            self._tb.close()
        for sink in self.sinks:
            sink.close()
        self.sinks = []


def _cell(v, width: int | None = None) -> str:
    s = f"{v:.3f}" if isinstance(v, float) else str(v)
    s = s.replace("\n", "⏎").replace("|", "\\|")
    return s if width is None or len(s) <= width else s[: width - 1] + "…"


def markdown_table(rows: list[dict]) -> str:
    """Rows as a markdown table (TensorBoard renders it in the Text tab)."""
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(r.get(c), 400) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def text_table(rows: list[dict], columns: list[str], width: int = 48) -> str:
    """Rows as a plain-text table for the console; long cells are cut to ``width`` characters."""
    cells = [[_cell(r.get(c), width) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*columns), fmt.format(*("-" * w for w in widths)), *(fmt.format(*row) for row in cells)]
    return "\n".join(line.rstrip() for line in lines)


def _row_step(line: str) -> float:
    try:
        return float(json.loads(line).get("step", math.inf))
    except (ValueError, AttributeError):  # a row cut by the kill: it goes too
        return math.inf


def _drop_rows_after(path: Path, step: int) -> int:
    """Rewrite JSONL ``path`` (if any) atomically without its rows past ``step``; returns how many went."""
    if not path.is_file():
        return 0
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if not line.strip() or _row_step(line) <= step]
    if len(kept) < len(lines):
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(kept))
        tmp.replace(path)
    return len(lines) - len(kept)


def read_metrics(log_dir: str | Path) -> list[dict]:
    with open(Path(log_dir) / "metrics.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]
