"""The session's logging part: console messages, the progress line or bar (:mod:`rlplane.utils.progress`),
per-step metrics (JSONL, TensorBoard, wandb / MLflow trackers) and the sample tables (samples.jsonl)."""

from __future__ import annotations

from rlplane.config.schema import RunConfig
from rlplane.utils.logging import MetricsLogger, text_table
from rlplane.utils.progress import Progress
from rlplane.utils.run_dir import RunPaths
from rlplane.utils.trackers import make_trackers


class RunLog:
    def __init__(self, cfg: RunConfig, paths: RunPaths, quiet: bool = False):
        self.cfg, self.quiet = cfg, quiet
        self.progress = Progress(cfg.loop.max_num_steps, cfg.algorithm, cfg.logger.log_every_n_steps,
                                 enabled=not quiet, bar=cfg.logger.progress_bar)
        trackers = make_trackers(cfg.logger, paths.run_dir.name, paths.log_dir, cfg.model_dump(mode="json"))
        self.logger = MetricsLogger(paths.log_dir, cfg.logger.jsonl_enabled, cfg.logger.tensorboard_enabled, trackers)
        # (kind, rows) sample tables waiting for the next log() (validation and training samples), and
        # the last step logged (training samples are due by step).
        self.pending_samples: list[tuple[str, list[dict]]] = []
        self.last_logged_step = 0

    def say(self, msg: str) -> None:
        if not self.quiet:
            self.progress.write(msg)

    def add_samples(self, kind: str, rows: list[dict]) -> None:
        """A table of samples (``validation`` or ``train``) written with the next :meth:`log`."""
        self.pending_samples.append((kind, rows))

    def train_samples_due(self) -> bool:
        """Whether the step being run writes its training samples (``logger.log_train_samples_every``)."""
        every = self.cfg.logger.log_train_samples_every
        return bool(every) and (self.last_logged_step + 1) % every == 0

    def log_prompts(self, step: int, record: dict) -> None:
        """The prompts step ``step`` drew and trained on: ``logs/prompts.jsonl`` (:mod:`rlplane.training.prompts`)."""
        self.logger.log_prompts(step, record)

    def log(self, metrics: dict, step: int) -> None:
        self.logger.log(metrics, step)
        self.last_logged_step = step
        for kind, rows in self.pending_samples:
            self.logger.log_samples(kind, step, rows)
            n = self.cfg.logger.num_val_samples_to_print
            if kind == "validation" and n and rows:
                cols = [c for c in ("prompt", "completion", "ground_truth", "reward") if c in rows[0]]
                where = self.logger.log_dir / "samples.jsonl"
                table = text_table(rows[:n], cols)
                self.say(f"validation samples at step {step} (all {len(rows)} in {where}):\n{table}")
        self.pending_samples.clear()
        self.progress.update(step, metrics)

    def close(self) -> None:
        self.progress.close()
        self.logger.close()
