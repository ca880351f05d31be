"""rollout_failure_policy end to end (sync GRPO on the embedded tiny model) with a flaky environment:
failures, retries and dropped groups are logged per step, and drop_group trains on full groups only."""

from __future__ import annotations

import pytest
import torch

from rlplane.config.loading import load_config
from rlplane.envs import ENV_REGISTRY, EnvironmentReturn, register_env
from rlplane.recipes import grpo
from rlplane.training import TrainingStopped
from rlplane.utils.logging import read_metrics

SMALL = [
    "grpo.num_prompts_per_step=8", "grpo.num_generations_per_prompt=4", "policy.train_global_batch_size=32",
    "policy.train_micro_batch_size=32", "policy.logprob_batch_size=32", "grpo.max_num_steps=2", "grpo.val_period=0",
    "grpo.val_at_start=false", "grpo.val_at_end=false", "warmup.enabled=false", "logger.progress_bar=false",
    "logger.tensorboard_enabled=false", "policy.generation.max_new_tokens=3",
]


class FailsOnSomeAnswers:
    """Reward 1 when the response starts with an odd digit; raises on prompts whose answer ends in 3 or 7
    (about a fifth of them), so the whole group of such a prompt fails."""

    def step(self, message_logs, metadata):
        from rlplane.envs import last_assistant_content

        if any(str(m["ground_truth"])[-1] in "37" for m in metadata):
            raise RuntimeError("scorer crashed")
        texts = [last_assistant_content(m) for m in message_logs]
        rewards = torch.tensor([float(t[:1] in "13579" and t[:1] != "") for t in texts])
        n = len(texts)
        return EnvironmentReturn([{}] * n, [None] * n, [None] * n, rewards, torch.ones(n, dtype=torch.bool), None)


@pytest.fixture
def flaky_env():
    saved = dict(ENV_REGISTRY)
    register_env("arithmetic", FailsOnSomeAnswers)
    yield
    ENV_REGISTRY.clear()
    ENV_REGISTRY.update(saved)


def run(tmp_path, monkeypatch, *extra):
    trained = []
    real = grpo.stamp_sample_mask  # the step's first call with the carry it trains on

    def recording(cfg, meta, carry):
        trained.append(carry["env_failed"].clone())
        return real(cfg, meta, carry)

    monkeypatch.setattr(grpo, "stamp_sample_mask", recording)
    grpo.train(load_config(None, [*SMALL, f"run_dir={tmp_path}", *extra]), quiet=True)
    return [r for r in read_metrics(tmp_path / "logs") if r["step"] > 0], trained


def test_zero_reward_trains_on_failed_samples_and_logs_them(tmp_path, monkeypatch, flaky_env):
    rows, trained = run(tmp_path, monkeypatch, "grpo.rollout_failure_policy=zero_reward")
    assert [r["step"] for r in rows] == [1, 2]
    for r, failed in zip(rows, trained):
        assert r["train/rollout_failures"] == float(failed.sum())  # failed samples are trained on (reward 0)
        assert r["train/rollout_retries"] == 0 and r["train/dropped_groups"] == 0
    assert sum(r["train/rollout_failures"] for r in rows) > 0


def test_drop_group_refills_with_full_groups(tmp_path, monkeypatch, flaky_env):
    rows, trained = run(tmp_path, monkeypatch, "grpo.rollout_failure_policy=drop_group")
    for r, failed in zip(rows, trained):
        assert not failed.any() and len(failed) == 32  # the target, with no failed sample
        assert r["train/rollout_failures"] == 4 * r["train/dropped_groups"] and r["train/num_samples"] == 32
        assert r["train/dynamic_sampling_num_gen_batches"] == 1 + (r["train/dropped_groups"] > 0)
    assert sum(r["train/dropped_groups"] for r in rows) > 0


def test_drop_group_stops_with_one_line_when_every_group_fails(tmp_path, monkeypatch):
    class AlwaysFails:
        def step(self, message_logs, metadata):
            raise RuntimeError("scorer crashed")

    saved = dict(ENV_REGISTRY)
    register_env("arithmetic", AlwaysFails)
    try:
        with pytest.raises(TrainingStopped, match="rollout_failure_policy = drop_group") as e:
            run(tmp_path, monkeypatch, "grpo.rollout_failure_policy=drop_group",
                "grpo.dynamic_sampling_max_gen_batches=2")
        assert "\n" not in str(e.value)
    finally:
        ENV_REGISTRY.clear()
        ENV_REGISTRY.update(saved)


def test_retry_logs_retries(tmp_path, monkeypatch, flaky_env):
    rows, _ = run(tmp_path, monkeypatch, "grpo.rollout_failure_policy=retry", "grpo.rollout_max_retries=1")
    for r in rows:  # the failing prompts fail again on a fresh environment: one retry each, then 0
        assert r["train/rollout_retries"] == r["train/rollout_failures"] and r["train/dropped_groups"] == 0
    assert sum(r["train/rollout_retries"] for r in rows) > 0


class HangingEnv:
    forever = __import__("threading").Event()

    def step(self, message_logs, metadata):
        self.forever.wait()


def test_hanging_environment_ends_the_run_with_one_line(tmp_path, capsys):
    import time

    from rlplane.cli import main

    saved = dict(ENV_REGISTRY)
    register_env("arithmetic", HangingEnv)
    try:
        t0 = time.monotonic()
        rc = main(["train", *SMALL, f"run_dir={tmp_path}", "env.step_timeout_s=1"])
        assert time.monotonic() - t0 < 30
    finally:
        ENV_REGISTRY.clear()
        ENV_REGISTRY.update(saved)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("rlplane: error: environment 'arithmetic': step on 32 samples did not return within 1 s")
    assert "env.step_timeout_s" in err[0]


def test_hanging_environment_stops_async_grpo(tmp_path):
    import time

    from rlplane.recipes import async_grpo

    saved = dict(ENV_REGISTRY)
    register_env("arithmetic", HangingEnv)
    try:
        t0 = time.monotonic()
        hung = r"async collector: environment 'arithmetic'.*env.step_timeout_s"
        with pytest.raises(TrainingStopped, match=hung) as e:
            async_grpo.train(load_config(None, [*SMALL, f"run_dir={tmp_path}", "env.step_timeout_s=1",
                                                "grpo.async_grpo.enabled=true",
                                                "loss_fn.use_importance_sampling_correction=true"]), quiet=True)
        assert time.monotonic() - t0 < 30 and "\n" not in str(e.value)
    finally:
        ENV_REGISTRY.clear()
        ENV_REGISTRY.update(saved)
