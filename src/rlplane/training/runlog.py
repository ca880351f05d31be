"""The session's logging: console, progress, per-step metric sinks and trackers, sample tables."""

from __future__ import annotations

from rlplane.config.logger import LoggerConfig
from rlplane.utils.logging import MetricsLogger, text_table
from rlplane.utils.progress import Progress
from rlplane.utils.run_dir import RunPaths
from rlplane.utils.trackers import make_trackers


class RunLog:
    """``max_num_steps`` and ``algorithm`` label the progress line; ``run_config`` goes to the trackers;
    ``sinks``: more metric sinks (a user's logger)."""

    def __init__(self, logger: LoggerConfig, paths: RunPaths, *, max_num_steps: int, algorithm: str,
                 run_config: dict, quiet: bool = False, sinks: list | None = None):
        self.options, self.quiet = logger, quiet
        self.progress = Progress(max_num_steps, algorithm, logger.log_every_n_steps,
                                 enabled=not quiet, bar=logger.progress_bar)
        trackers = make_trackers(logger, paths.run_dir.name, paths.log_dir, run_config)
        self.logger = MetricsLogger(paths.log_dir, logger.jsonl_enabled, logger.tensorboard_enabled,
                                    [*trackers, *(sinks or [])])
        # Sample tables waiting for the next log(), and the last step logged.
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
        every = self.options.log_train_samples_every
        return bool(every) and (self.last_logged_step + 1) % every == 0

    def log_prompts(self, step: int, record: dict) -> None:
        """The prompts step ``step`` drew and trained on: ``logs/prompts.jsonl`` (:mod:`rlplane.training.prompts`)."""
        self.logger.log_prompts(step, record)

    def log(self, metrics: dict, step: int) -> None:
        self.logger.log(metrics, step)
        self.last_logged_step = step
        for kind, rows in self.pending_samples:
            self.logger.log_samples(kind, step, rows)
            n = self.options.num_val_samples_to_print
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


def actor_death_lines(step: int, metrics: dict[str, float], algorithm: str, failure_policy: str) -> list[str]:
    """One line per environment whose actors died during step ``step`` (``runtime: ray``; Ray restarted them), from
    its ``<phase>/env/<task>/actor_deaths`` metrics."""
    lines = []
    for key, deaths in metrics.items():
        if key.endswith("/actor_deaths") and deaths:
            phase, _, task, _ = key.split("/")
            lines.append(f"step {step}: {deaths:g} environment actor(s) of {task!r} died during {phase} and were "
                         f"restarted; the samples they held followed {algorithm}.rollout_failure_policy = "
                         f"{failure_policy} ({phase}/rollout_failures = "
                         f"{metrics.get(f'{phase}/rollout_failures', 0):g}, rollout_retries = "
                         f"{metrics.get(f'{phase}/rollout_retries', 0):g})")
    return lines
