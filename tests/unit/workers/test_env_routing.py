"""Environment steps routed by task_name: one batched call per task, the tasks' pools stepped at once,
the samples a dead environment actor held failing together (and retried on a fresh one when asked),
validation routed by env.val_task_to_env, and each environment's metrics() after a rollout."""

from __future__ import annotations

import threading

import pytest
import torch

from rlplane.config.loading import load_config
from rlplane.envs import ENV_REGISTRY, EnvironmentReturn, register_env
from rlplane.envs.interface import EnvBatch, default_env_metrics
from rlplane.runtime.env_pools import EnvActorDied, join_returns, pool_env_names, pool_name
from rlplane.workers.env_metrics import env_metrics, merge_env_metrics
from rlplane.workers.env_steps import step_envs
from rlplane.workers.sample_state import SampleState
from tests.tiny import rollout_worker


def states(tasks):
    return [SampleState(input_ids=[1], prompt_length=1, message_log=[{"role": "assistant", "content": str(i)}],
                        env_info={"i": i}, task_name=t, stop_strings=None) for i, t in enumerate(tasks)]


def ret(rewards):
    n = len(rewards)
    return EnvironmentReturn([{}] * n, [None] * n, [None] * n, torch.tensor(rewards, dtype=torch.float32),
                             torch.ones(n, dtype=torch.bool), None)


class Recording:
    """Reward = 10 * tag + the sample's index; records each call's sample indices."""

    def __init__(self, tag, barrier=None):
        self.tag, self.barrier, self.calls = tag, barrier, []

    def step(self, logs, meta):
        if self.barrier is not None:
            self.barrier.wait()  # both tasks' steps must be under way together to pass
        self.calls.append([m["i"] for m in meta])
        return ret([10 * self.tag + m["i"] for m in meta])


def test_samples_go_to_their_task_environment_in_one_call_per_task():
    envs = {"a": Recording(1), "b": Recording(2)}
    s = states(["a", "b", "a", "b", "a"])
    assert step_envs(s, list(range(5)), envs.__getitem__) == (0, 0)
    assert envs["a"].calls == [[0, 2, 4]] and envs["b"].calls == [[1, 3]]
    assert [x.reward for x in s] == [10, 21, 12, 23, 14]


def test_concurrent_steps_run_the_tasks_at_once():
    barrier = threading.Barrier(2, timeout=20)  # a sequential loop would break it (BrokenBarrierError)
    envs = {"a": Recording(1, barrier), "b": Recording(2, barrier)}
    s = states(["a", "b"])
    assert step_envs(s, [0, 1], envs.__getitem__, concurrent=True) == (0, 0)
    assert [x.reward for x in s] == [10, 21]


class DiesOnce:
    """A pool whose actor holding samples 0 and 1 of the first batch dies; ``renewed`` counts renewals."""

    def __init__(self):
        self.calls, self.renewed = [], 0

    def step(self, logs, meta):
        self.calls.append([m["i"] for m in meta])
        if len(self.calls) == 1:
            raise EnvActorDied("environment actor 't' #0 died during the step", [0, 1])
        return ret([1.0] * len(meta))


def test_samples_of_a_dead_actor_fail_together_and_the_others_are_stepped_again():
    env = DiesOnce()
    s = states(["t"] * 4)
    assert step_envs(s, list(range(4)), lambda t: env) == (2, 0)
    assert env.calls == [[0, 1, 2, 3], [2, 3]]  # not one by one: an actor death is not the samples' fault
    assert [x.env_error for x in s] == [True, True, False, False]
    assert [x.reward for x in s] == [0.0, 0.0, 1.0, 1.0]


def test_retry_reruns_a_dead_actors_samples_on_a_renewed_pool():
    env = DiesOnce()

    def renew(task):
        env.renewed += 1
        return env

    s = states(["t"] * 4)
    assert step_envs(s, list(range(4)), lambda t: env, renew, max_retries=2) == (0, 2)
    assert env.renewed == 1 and env.calls[-1] == [0, 1]
    assert all(x.reward == 1.0 and not x.env_error for x in s)


def test_pools_route_validation_by_val_task_to_env():
    mapping = {"math": "math_strict"}
    assert pool_name("math", False, mapping) == "math" and pool_name("math", True, mapping) == "val/math"
    assert pool_name("code", True, mapping) == "code"  # unnamed: validates on its training environment
    assert pool_env_names(["math", "code", "math"], mapping) == {"math": "math", "code": "code",
                                                                 "val/math": "math_strict"}


def test_join_returns_keeps_chunk_order_and_fills_what_a_chunk_left_unset():
    a = EnvironmentReturn([{"content": "x"}], None, None, torch.tensor([1.0]), torch.tensor([True]), ["1"],
                          {"correct": torch.tensor([1.0])})
    b = EnvironmentReturn([{"content": "y"}, {"content": "z"}], [{"m": 2}, {"m": 3}], [["."], None],
                          torch.tensor([0.0, 0.5]), torch.tensor([False, True]), None, None)
    j = join_returns([a, b], [[{"m": 0}], [{"m": 1}, {"m": 2}]])
    assert [o["content"] for o in j.observations] == ["x", "y", "z"]
    assert j.metadata == [{"m": 0}, {"m": 2}, {"m": 3}]  # None: the chunk's input metadata, unchanged
    assert j.next_stop_strings == [None, ["."], None] and j.answers == ["1", None, None]
    assert j.rewards.tolist() == [1.0, 0.0, 0.5] and j.terminateds.tolist() == [True, False, True]
    assert j.reward_components["correct"].tolist() == [1.0, 0.0, 0.0]


def test_default_metrics_follow_nemo_rl_names():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    batch = EnvBatch(torch.tensor([0, 0, 1, 1]), torch.tensor([False, True, False, False]),
                     torch.tensor([3, 3, 5, 5]), torch.tensor([2, 4, 1, 1]))
    m = default_env_metrics(rewards, batch)
    # accuracy 1/4; pass@2: group 0 has a hit, group 1 none -> 1/2; 3 of 4 not truncated;
    # response lengths (2+4+1+1)/4 = 2; prompt lengths (3+3+5+5)/4 = 4.
    assert m == {"accuracy": 0.25, "pass@2": 0.5, "fraction_of_samples_properly_ended": 0.75,
                 "generation_lengths": 2.0, "prompt_lengths": 4.0}


def test_env_metrics_are_per_task_and_merge_weighted_by_each_tasks_samples():
    batch = EnvBatch(torch.arange(3), torch.zeros(3, dtype=torch.bool), torch.ones(3), torch.ones(3))
    calls = []

    def metrics_of(task):
        def fn(rewards, b):
            calls.append((task, rewards.tolist(), b.group.tolist()))
            return {"accuracy": float(rewards.mean()), "max_x": float(rewards.max())}
        return fn

    first = env_metrics(["a", "b", "a"], torch.tensor([1.0, 0.0, 0.0]), batch, metrics_of)
    assert calls == [("a", [1.0, 0.0], [0, 2]), ("b", [0.0], [1])]
    assert first == {"env/a/accuracy": 0.5, "env/a/max_x": 1.0, "env/a/num_samples": 2.0,
                     "env/b/accuracy": 0.0, "env/b/max_x": 0.0, "env/b/num_samples": 1.0}
    second = {"env/a/accuracy": 1.0, "env/a/max_x": 1.0, "env/a/num_samples": 1.0, "env/a/actor_deaths": 1.0}
    merged = merge_env_metrics([first, second, {"reward": 3.0}])
    # a: (0.5 * 2 + 1.0 * 1) / 3 = 2/3 over 3 samples; b unchanged; counts summed; other keys left out.
    assert merged["env/a/accuracy"] == pytest.approx(2 / 3) and merged["env/a/num_samples"] == 3.0
    assert merged["env/a/actor_deaths"] == 1.0 and merged["env/b/accuracy"] == 0.0 and "reward" not in merged


def test_a_metrics_that_raises_is_a_warning_not_the_end_of_the_run(caplog):
    batch = EnvBatch(torch.arange(2), torch.zeros(2, dtype=torch.bool), torch.ones(2), torch.ones(2))

    def broken(task):
        def fn(rewards, b):
            raise KeyError("no such field")
        return fn

    assert env_metrics(["a", "a"], torch.ones(2), batch, broken) == {}
    assert "metrics() raised KeyError" in caplog.text


class WithMetrics:
    """Counts metrics() calls and says which samples it saw."""

    calls: list = []

    def step(self, logs, meta):
        return ret([1.0] * len(meta))

    def metrics(self, rewards, batch):
        type(self).calls.append(len(rewards))
        return {"seen": float(len(rewards))}


class Strict:
    """A validation environment: reward 0.25 for every sample."""

    def step(self, logs, meta):
        return ret([0.25] * len(meta))


@pytest.fixture
def with_metrics():
    saved = dict(ENV_REGISTRY)
    register_env("arithmetic", WithMetrics)
    register_env("strict", Strict)
    WithMetrics.calls = []
    yield WithMetrics
    ENV_REGISTRY.clear()
    ENV_REGISTRY.update(saved)


def test_a_rollout_calls_each_environments_metrics_and_validation_uses_val_task_to_env(with_metrics):
    from rlplane.datasets import build_datasets
    from rlplane.models.configured import load_configured_policy

    cfg = load_config(None, ["grpo.num_prompts_per_step=3", "grpo.num_generations_per_prompt=2",
                             "policy.train_global_batch_size=6", "data.num_train_samples=16",
                             "policy.generation.max_new_tokens=2", "env.val_task_to_env.arithmetic=strict"])
    model, tok = load_configured_policy(cfg.policy, cfg.loop.seed)
    loader, _, _ = build_datasets(cfg.dataset_options(), tok)
    worker, datums = rollout_worker(cfg, None, model=model, tokenizer=tok), next(loader)
    _, carry, metrics = worker.finish(worker.score(worker.generate(datums, group_size=2)))  # training prompts
    assert with_metrics.calls == [6] and carry["rewards"].tolist() == [1.0] * 6
    assert metrics["env/arithmetic/seen"] == 6.0 and metrics["env/arithmetic/num_samples"] == 6.0
    assert "env/arithmetic/actor_deaths" not in metrics  # in-process: no actors
    _, carry, metrics = worker.rollout(datums, group_size=1, partition_id=None, heldout=True)
    assert carry["rewards"].tolist() == [0.25] * 3 and with_metrics.calls == [6]  # scored by `strict`
    assert metrics["env/arithmetic/accuracy"] == 0.25  # the default metrics of the validation environment


def test_pool_specs_one_per_environment_under_ray_only():
    from rlplane.training.plan import build_plan, env_pool_specs
    from rlplane.training.workers import ray_cpu_demand

    cfg = load_config(None, ["runtime=ray", "data_plane.backend=ray", "env.actors_per_env=2", "env.actors.code=0",
                             "env.actors.calculator=3", "env.val_task_to_env.arithmetic=calculator"])
    register_env("made_here", lambda **kw: Strict())  # a lambda cannot reach another process: no pool
    specs = env_pool_specs(cfg, ["arithmetic", "calculator", "code", "made_here"])
    assert specs == {"arithmetic": ("arithmetic", 2), "calculator": ("calculator", 3),
                     "val/arithmetic": ("calculator", 3)}
    assert env_pool_specs(load_config(None, []), ["arithmetic"]) == {}  # runtime: local keeps them in-process
    cpus = load_config(None, ["runtime=ray", "data_plane.backend=ray", "env.cpus_per_actor=0.25"])
    assert ray_cpu_demand(build_plan(cpus, task_names=["arithmetic", "calculator"])) == 0.5 + 0.5 + 2 * 0.25


def test_no_pools_start_no_ray(monkeypatch):
    """runtime: local has no pools: waiting for none must not touch Ray (ray.wait would start an instance)."""
    import ray

    from rlplane.runtime.env_pools import await_env_pools

    monkeypatch.setattr(ray, "wait", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ray.wait called")))
    await_env_pools({})
