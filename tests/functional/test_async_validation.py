"""Async GRPO validates with its collector paused (NeMo RL pauses generation for validation): the
validation's generation does not share the machine with the collector's, and the schedule resumes after."""

from __future__ import annotations

from rlplane.async_rl import AsyncTrajectoryCollector
from rlplane.config.loading import load_config
from rlplane.recipes import async_grpo
from rlplane.training import session
from rlplane.utils.logging import read_metrics

SMALL = [
    "grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=4", "policy.train_global_batch_size=16",
    "policy.train_micro_batch_size=8", "grpo.max_num_steps=3", "grpo.val_period=1", "grpo.val_at_start=false",
    "grpo.max_val_samples=8", "grpo.val_batch_size=8", "warmup.enabled=false", "checkpointing.enabled=false",
    "logger.progress_bar=false", "logger.tensorboard_enabled=false", "grpo.async_grpo.enabled=true",
    "loss_fn.use_importance_sampling_correction=true",
]


def test_validation_runs_with_the_collector_paused(tmp_path, first_digit_env, monkeypatch):
    calls, collectors = [], []
    real_pause, real_resume, real_validate = (AsyncTrajectoryCollector.pause, AsyncTrajectoryCollector.resume,
                                              session.validate)

    def pause(self):
        collectors.append(self)
        calls.append("pause")
        real_pause(self)

    def resume(self):
        calls.append("resume")
        real_resume(self)

    def validate(*args, **kwargs):
        # paused, and settled: no batch of the collector's in flight beside the validation's generation
        calls.append(("validate", all(c.schedule.paused and c.schedule.settled() for c in collectors)
                      and bool(collectors)))
        return real_validate(*args, **kwargs)

    monkeypatch.setattr(AsyncTrajectoryCollector, "pause", pause)
    monkeypatch.setattr(AsyncTrajectoryCollector, "resume", resume)
    monkeypatch.setattr(session, "validate", validate)
    async_grpo.train(load_config(None, [*SMALL, f"run_dir={tmp_path}"]), quiet=True)
    assert calls == ["pause", ("validate", True), "resume"] * 3
    rows = [r for r in read_metrics(tmp_path / "logs") if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2, 3] and all("validation/accuracy" in r for r in rows)
