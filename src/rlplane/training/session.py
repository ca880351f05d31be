"""A training session: the named parts a recipe composes, built in the order they are needed.

    s = Session(cfg)           prompts (data errors surface before anything slow), data plane,
                               workers (not started yet), refit, checkpoints, progress
    start = s.start()          resume from a checkpoint, or warm up and start the workers; validate
    ... the recipe's steps ...    s.workers / s.refit / s.data_plane / s.prompts, then per step:
    s.end_step(step, metrics)  validate when due, log, checkpoint when due
    s.summary()                the run's before/after figures; s.close() (or ``with``) stops everything

Each part has one job: :class:`Prompts` (data), :class:`Workers` (actors, through the runtime
layer), :class:`Refit` (generator weights), :class:`Checkpoints` (save / restore), :class:`Progress`
(console, metric sinks, progress bar), :func:`warm_up` (the supervised warm-up).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rlplane.config.loading import dump_config
from rlplane.config.schema import RunConfig
from rlplane.dataplane import make_data_plane
from rlplane.runtime.groups import init_ray
from rlplane.training.checkpoints import Checkpoints
from rlplane.training.loop import validate
from rlplane.training.progress import Progress
from rlplane.training.prompts import Prompts
from rlplane.training.refit import Refit
from rlplane.training.warmup import warm_up
from rlplane.training.workers import Workers
from rlplane.utils.seeding import seed_everything
from rlplane.workers.base import load_configured_policy


class Session:
    """``critic``: the recipe trains a value model; ``teacher_cfg``: the run config of a frozen teacher
    (its own model and warm-up) whose worker group the recipe reads ``teacher_logprobs`` from."""

    def __init__(self, cfg: RunConfig, quiet: bool = False, *, critic: bool = False,
                 teacher_cfg: RunConfig | None = None):
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(dump_config(cfg))
        torch.set_num_threads(cfg.policy.threads_per_worker)
        seed_everything(cfg.loop.seed)
        self._t_start = time.perf_counter()
        self.progress = Progress(cfg, self.run_dir, quiet)
        # Tokenizer and data first: data errors should surface before anything slow starts.
        _, tokenizer = load_configured_policy(cfg)
        self.prompts = Prompts(cfg, tokenizer)
        if self.prompts.stats.get("skipped_overlong"):
            self.say(f"skipped {self.prompts.stats['skipped_overlong']} prompts longer than policy.max_total_sequence_length")
        if cfg.runtime == "ray" or cfg.data_plane.backend == "ray":
            init_ray(cfg.cluster.num_cpus, cfg.cluster.address)
        self.data_plane = make_data_plane(cfg.data_plane.backend)
        self.workers = Workers(cfg, self.data_plane, critic=critic, teacher_cfg=teacher_cfg)
        self.refit = Refit(self.workers)
        self.checkpoints = Checkpoints(cfg, self.run_dir, self.workers, self.prompts)
        self.initial_validation: dict[str, float] = {}
        self.warmup_result: dict[str, float] = {}
        self.teacher_warmup_result: dict[str, float] = {}
        self.last_validation: dict[str, float] = {}
        self._closers: list[Callable[[], None]] = []

    def say(self, msg: str) -> None:
        self.progress.say(msg)

    # ---- start: resume, or warm up -----------------------------------------------------------------
    def start(self) -> int:
        """Resume from the latest checkpoint (``checkpointing.resume``) or warm up; start the workers;
        validate before the first step (``val_at_start``). Returns the step to start from."""
        cfg = self.cfg
        latest = self.checkpoints.to_resume(self.say)
        if latest is not None:
            self.workers.start(init_state=None)
            info = self.checkpoints.restore(latest)
            self.initial_validation = info.get("initial_validation", {})
            self.warmup_result = info.get("warmup", {})
            self.teacher_warmup_result = info.get("teacher_warmup", {})
            self.refit.mark_stale()
            self.say(f"resumed from {latest} at step {info['step']}")
            start = int(info["step"])
        else:
            state = None
            if cfg.warmup.enabled:
                state, self.warmup_result = warm_up(cfg, self.prompts, self.say)
            teacher_state, teacher_cfg = None, self.workers.teacher_cfg
            if teacher_cfg is not None and teacher_cfg.warmup.enabled:
                self.say("teacher:")
                teacher_state, self.teacher_warmup_result = warm_up(teacher_cfg, self.prompts, self.say)
            self.workers.start(state, teacher_state)
            if cfg.runtime != "local":  # the rollout actor built its own weights: push the policy's now
                self.refit.mark_stale()
                self.refit.if_stale()
            start = 0
        if start == 0 and cfg.loop.val_at_start:
            self.initial_validation = self.validate()
            self.progress.log(self.initial_validation, step=0)
        self.last_validation = dict(self.initial_validation)
        return start

    def validate(self) -> dict[str, float]:
        """``validation/*`` of the current policy (the generator is refit first if stale)."""
        self.refit.if_stale()
        return {f"validation/{k}": v for k, v in validate(self.cfg, self.workers.rollout, self.prompts.val_datums).items()}

    # ---- after each step ---------------------------------------------------------------------------
    def end_step(self, step: int, metrics: dict[str, float]) -> None:
        """After step ``step`` (from 0): validate when due, log, checkpoint when due."""
        g, done = self.cfg.loop, step + 1
        if (g.val_period and done % g.val_period == 0) or (g.val_at_end and done == g.max_num_steps):
            t0 = time.perf_counter()
            self.last_validation = self.validate()
            metrics.update(self.last_validation)
            metrics["timing/validation/total"] = time.perf_counter() - t0
        self.progress.log(metrics, step=done)
        if self.checkpoints.due(done):
            info = {"initial_validation": self.initial_validation, "warmup": self.warmup_result}
            if self.teacher_warmup_result:
                info["teacher_warmup"] = self.teacher_warmup_result
            self.checkpoints.save(done, metrics, info)

    def summary(self) -> dict:
        out = {
            "run_dir": str(self.run_dir),
            "warmup": self.warmup_result,
            "accuracy_before": self.initial_validation.get("validation/accuracy"),
            "accuracy_after": self.last_validation.get("validation/accuracy"),
            "wall_seconds": time.perf_counter() - self._t_start,
        }
        if self.teacher_warmup_result:
            out["teacher_warmup"] = self.teacher_warmup_result
        (self.run_dir / "summary.json").write_text(json.dumps(out, indent=2))
        return out

    # ---- shutdown ----------------------------------------------------------------------------------
    def on_close(self, stop: Callable[[], None]) -> None:
        """Run ``stop`` first when the session closes (a recipe's own actor: async GRPO's collector)."""
        self._closers.append(stop)

    def close(self) -> None:
        for stop in self._closers:
            stop()
        self._closers.clear()
        self.progress.close()
        self.workers.close()
        self.data_plane.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
