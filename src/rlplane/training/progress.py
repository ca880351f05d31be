"""The session's console and metric sinks: messages, the per-step metrics (JSONL, TensorBoard) and
the progress bar on stderr."""

from __future__ import annotations

import sys
from pathlib import Path

from rlplane.config.schema import RunConfig
from rlplane.utils.logging import MetricsLogger


class Progress:
    def __init__(self, cfg: RunConfig, run_dir: Path, quiet: bool = False):
        self.cfg = cfg
        self.quiet = quiet
        log_dir = cfg.logger.log_dir or run_dir / "logs"
        self.logger = MetricsLogger(log_dir, cfg.logger.jsonl_enabled, cfg.logger.tensorboard_enabled)
        self._bar = None

    def say(self, msg: str) -> None:
        if not self.quiet:
            if self._bar is not None:
                self._bar.write(msg)
            else:
                print(msg, file=sys.stderr, flush=True)

    def log(self, metrics: dict, step: int) -> None:
        self.logger.log(metrics, step)
        if self._bar is None and self.cfg.logger.progress_bar and not self.quiet and step > 0:
            from tqdm import tqdm

            self._bar = tqdm(total=self.cfg.loop.max_num_steps, initial=step - 1, desc=self.cfg.algorithm, file=sys.stderr,
                             dynamic_ncols=True)
        if self._bar is not None:
            self._bar.n = step
            post = {"reward": metrics.get("train/reward")}
            if "validation/accuracy" in metrics:
                post["val_acc"] = metrics["validation/accuracy"]
            self._bar.set_postfix({k: f"{v:.3f}" for k, v in post.items() if v is not None}, refresh=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self.logger.close()
