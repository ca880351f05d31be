"""env.actors_per_env across its range (0, 1, 2, 3) and per-task env.actors.<task>: each task's samples are
stepped by its own pool (split over exactly its actors) or, with no pool, in-process, and a deterministic
environment gives the same results as the in-process path for every mix of tasks."""

from __future__ import annotations

import os
import random

import pytest

from rlplane.config.loading import load_config
from rlplane.envs.registry import env_registry_snapshot
from rlplane.envs.user import IMPORT_PATH_VAR
from rlplane.runtime.env_pools import await_env_pools, start_env_pools
from rlplane.training.plan import env_pool_specs
from rlplane.workers.env_steps import step_envs
from rlplane.workers.sample_state import SampleState
from tests.tiny import rollout_worker

pytestmark = [pytest.mark.ray, pytest.mark.slow]

MODULE = "tag_env_for_pool_size_tests"
SOURCE = '''
import os
import torch
from rlplane.envs import EnvironmentReturn

class TagEnv:
    """Deterministic: reward from its tag and the sample; every sample goes on with an observation naming the tag."""
    reward_component_names = ("tag",)

    def __init__(self, tag):
        self.tag = tag

    def step(self, logs, meta):
        n = len(logs)
        rewards = torch.tensor([10.0 * self.tag + len(log[-1]["content"]) + 0.5 * m["i"] for log, m in zip(logs, meta)])
        done = torch.zeros(n, dtype=torch.bool)  # not done: the observation and metadata land in the sample
        obs = [{"role": "environment", "content": f"tag {self.tag} saw {m['i']}"} for m in meta]
        info = [{**m, "by": self.tag, "pid": os.getpid()} for m in meta]
        return EnvironmentReturn(obs, info, [None] * n, rewards, done, None, {"tag": torch.full((n,), float(self.tag))})
'''

# (overrides, expected pool sizes): every value of env.actors_per_env the test covers, and per-task overrides.
CASES = [
    (["env.actors_per_env=0"], {}),
    (["env.actors_per_env=1"], {"a": 1, "b": 1}),
    (["env.actors_per_env=2"], {"a": 2, "b": 2}),
    (["env.actors_per_env=3"], {"a": 3, "b": 3}),
    (["env.actors_per_env=1", "env.actors.b=3"], {"a": 1, "b": 3}),
    (["env.actors_per_env=0", "env.actors.a=2"], {"a": 2}),
]


def _states(tasks):
    return [SampleState(input_ids=[1], prompt_length=1, message_log=[{"role": "assistant", "content": "x" * (i % 4)}],
                        env_info={"i": i}, task_name=t, stop_strings=None) for i, t in enumerate(tasks)]


def _result(s: SampleState) -> tuple:
    info = {k: v for k, v in s.env_info.items() if k != "pid"}
    return s.task_name, s.reward, s.reward_components, s.message_log, info, s.done


@pytest.mark.parametrize("overrides, sizes", CASES, ids=[" ".join(o) for o, _ in CASES])
def test_each_tasks_samples_go_to_its_pool_and_match_the_in_process_path(ray_session, tmp_path, monkeypatch,
                                                                         overrides, sizes):
    (tmp_path / f"{MODULE}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(None, ["runtime=ray", "data_plane.backend=ray", "warmup.enabled=false",
                             f"env.a.class={MODULE}:TagEnv", "env.a.kwargs.tag=1", f"env.b.class={MODULE}:TagEnv",
                             "env.b.kwargs.tag=2", *overrides])
    local = rollout_worker(cfg, None)  # registers the user tasks; no pools: every task in-process
    specs = env_pool_specs(cfg, ["a", "b"])
    assert {name: n for name, (_, n) in specs.items()} == sizes
    pools = start_env_pools(specs, cfg.env.env_kwargs, env_registry_snapshot(), cfg.env,
                            env_vars={IMPORT_PATH_VAR: str(tmp_path)})
    try:
        await_env_pools(pools)
        worker = rollout_worker(cfg, None, model=local.backend.model, tokenizer=local.tokenizer, env_pools=pools)
        actor_pids = {name: {w["pid"] for w in p.placement()} for name, p in pools.items()}
        assert {name: len(pids) for name, pids in actor_pids.items()} == sizes
        rng = random.Random(len(overrides) * 10 + sum(sizes.values()))
        for _ in range(4):  # random mixes of the two tasks, 1 to 9 samples
            tasks = [rng.choice("ab") for _ in range(rng.randint(1, 9))]
            pooled, in_process = _states(tasks), _states(tasks)
            assert step_envs(pooled, list(range(len(tasks))), worker.envs.get, concurrent=bool(pools)) == (0, 0)
            assert step_envs(in_process, list(range(len(tasks))), local.envs.get) == (0, 0)
            assert [_result(s) for s in pooled] == [_result(s) for s in in_process]
            for task, tag in (("a", 1), ("b", 2)):
                mine = [s for s in pooled if s.task_name == task]
                assert all(s.env_info["by"] == tag for s in mine)  # stepped by its own task's environment
                pids = {s.env_info["pid"] for s in mine}
                if task in pools:  # split contiguously over min(actors, samples) of its own pool's actors
                    assert pids <= actor_pids[task] and len(pids) == min(sizes[task], len(mine))
                else:
                    assert pids <= {os.getpid()}
    finally:
        for p in pools.values():
            p.close()
