"""Deadlines: an environment that sleeps forever or a generator that never returns ends the run with
a one-line error naming what hung, the deadline and the key to raise; every test ends in seconds."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from rlplane.config.loading import load_config
from rlplane.datasets import build_datasets
from rlplane.envs import ENV_REGISTRY, EnvironmentReturn, register_env
from rlplane.models.configured import load_configured_policy
from rlplane.runtime.deadlines import DeadlineExceeded, call_with_deadline
from tests.tiny import rollout_worker

FOREVER = threading.Event()  # never set: waiting on it is a hang


class HangingEnv:
    def step(self, message_logs, metadata):
        FOREVER.wait()


class QuickEnv:
    def step(self, message_logs, metadata):
        n = len(message_logs)
        return EnvironmentReturn([{}] * n, [None] * n, [None] * n, torch.ones(n), torch.ones(n, dtype=torch.bool), None)


@pytest.fixture
def env_class():
    saved = dict(ENV_REGISTRY)

    def use(cls):
        register_env("arithmetic", cls)

    yield use
    ENV_REGISTRY.clear()
    ENV_REGISTRY.update(saved)


def worker_and_prompts(*extra):
    cfg = load_config(None, ["grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=2",
                             "policy.train_global_batch_size=8", "data.num_train_samples=64",
                             "policy.generation.max_new_tokens=3", *extra])
    model, tok = load_configured_policy(cfg.policy, cfg.loop.seed)
    loader, _, _ = build_datasets(cfg.dataset_options(), tok)
    return rollout_worker(cfg, None, model=model, tokenizer=tok), next(loader)


def test_call_with_deadline():
    assert call_with_deadline(lambda: 7, 5.0, "x", "k") == 7
    assert call_with_deadline(lambda: 8, None, "x", "k") == 8
    with pytest.raises(ZeroDivisionError):
        call_with_deadline(lambda: 1 / 0, 5.0, "x", "k")
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded, match=r"^the thing did not return within 0.2 s \(a.b = 0.2\); raise a.b"):
        call_with_deadline(lambda: FOREVER.wait(), 0.2, "the thing", "a.b")
    assert time.monotonic() - t0 < 2


@pytest.mark.parametrize("policy", ["zero_reward", "retry"])
def test_hanging_environment_stops_the_rollout(env_class, policy):
    env_class(HangingEnv)
    worker, datums = worker_and_prompts("env.step_timeout_s=0.5", f"grpo.rollout_failure_policy={policy}")
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded) as e:
        worker.rollout(datums, group_size=2, partition_id=None)
    assert time.monotonic() - t0 < 5  # one deadline: not retried, not stepped sample by sample
    msg = str(e.value)
    assert "\n" not in msg and "environment 'arithmetic'" in msg and "0.5 s" in msg and "env.step_timeout_s" in msg


def test_hanging_generator_stops_the_rollout(env_class, monkeypatch):
    env_class(QuickEnv)
    worker, datums = worker_and_prompts("policy.generation.timeout_s=0.5")
    monkeypatch.setattr(worker.backend, "generate", lambda *a, **k: FOREVER.wait())
    t0 = time.monotonic()
    hung = r"rollout worker: generation of 8 samples .* policy.generation.timeout_s"
    with pytest.raises(DeadlineExceeded, match=hung):
        worker.rollout(datums, group_size=2, partition_id=None)
    assert time.monotonic() - t0 < 5


def test_quick_calls_are_unchanged_by_the_deadline(env_class):
    env_class(QuickEnv)
    worker, datums = worker_and_prompts("env.step_timeout_s=30", "policy.generation.timeout_s=30")
    _, carry, _ = worker.rollout(datums, group_size=2, partition_id=None)
    assert carry["rewards"].tolist() == [1.0] * 8


def test_ray_get_deadline_and_unwrapped_error(ray_session):
    from rlplane.runtime.deadlines import ray_get

    @ray_session.remote(num_cpus=0)
    class Actor:
        def hang(self):
            time.sleep(60)

        def hung_inside(self):
            call_with_deadline(lambda: time.sleep(60), 0.2, "environment 'x': step on 1 samples", "env.step_timeout_s")

    actor = Actor.options(max_concurrency=2).remote()
    try:
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded, match=r"^rollout worker did not return within 0.5 s .*policy.generation"):
            ray_get(actor.hang.remote(), 0.5, "rollout worker", "policy.generation.timeout_s")
        # A deadline hit inside the actor: its own one line, not Ray's wrapped traceback.
        with pytest.raises(DeadlineExceeded) as e:
            ray_get(actor.hung_inside.remote())
        assert str(e.value).startswith("environment 'x': step on 1 samples did not return within 0.2 s")
        assert "\n" not in str(e.value) and time.monotonic() - t0 < 30
    finally:
        ray_session.kill(actor)
