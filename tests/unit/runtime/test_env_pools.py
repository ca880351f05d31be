"""Environment actor pools on the shared Ray instance: a batch split over the pool's actors in order,
metrics and placement from the actors, an actor killed between steps or during one restarted by Ray
(the samples it held fail with EnvActorDied, later steps go on), one killed in metrics() counted and asked again."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from rlplane.config.loading import load_config
from rlplane.envs.interface import EnvBatch
from rlplane.envs.registry import ENV_REGISTRY, env_registry_snapshot
from rlplane.envs.user import IMPORT_PATH_VAR, register_user_tasks
from rlplane.runtime.env_pools import EnvActorDied, await_env_pools, start_env_pools

pytestmark = pytest.mark.ray

MODULE = "pid_env_for_pool_tests"
SOURCE = '''
import os
import torch
from rlplane.envs import EnvironmentReturn

class PidEnv:
    """Answers with its process id; kills its own process on a sample whose metadata says so."""
    reward_component_names = ("one",)

    def step(self, logs, meta):
        if any(m.get("die") for m in meta):
            os.kill(os.getpid(), 9)
        n = len(logs)
        return EnvironmentReturn([{}] * n, list(meta), [None] * n, torch.ones(n), torch.ones(n, dtype=torch.bool),
                                 [str(os.getpid())] * n, {"one": torch.ones(n)})

    def metrics(self, rewards, batch):
        marker = os.path.join(os.path.dirname(__file__), "die_in_metrics")
        if os.path.exists(marker):
            os.remove(marker)
            os.kill(os.getpid(), 9)
        return {"pid": float(os.getpid()), "seen": float(len(rewards))}
'''


@pytest.fixture(scope="module")
def source_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("pid_env")


@pytest.fixture(scope="module")
def pool(ray_session, source_dir):
    """One pool of two actors for the module (actors take seconds to start); each test reads where they are now."""
    tmp_path = source_dir
    (tmp_path / f"{MODULE}.py").write_text(SOURCE)
    env_cfg = load_config(None, [f"env.pid.class={MODULE}:PidEnv"]).env
    register_user_tasks(env_cfg)  # the driver's registry names the task; the actors import the module
    pools = start_env_pools({"pid": ("pid", 2)}, env_cfg.env_kwargs, env_registry_snapshot(), env_cfg,
                            env_vars={IMPORT_PATH_VAR: str(tmp_path)})
    ENV_REGISTRY.pop("pid")  # the actors hold their own copy; later tests' registries stay as they were
    await_env_pools(pools)
    yield pools["pid"]
    pools["pid"].close()


def step(pool, n, **meta):
    logs = [[{"role": "assistant", "content": "1"}] for _ in range(n)]
    return pool.step(logs, [{"i": i, **meta} for i in range(n)])


def test_a_batch_is_split_in_order_over_the_pools_actors(pool):
    where = pool.placement()
    assert [(w["pool"], w["env"], w["actor"]) for w in where] == [("pid", "pid", 0), ("pid", "pid", 1)]
    pids = [str(w["pid"]) for w in where]
    assert len(set(pids)) == 2 and os.getpid() not in {w["pid"] for w in where}
    ret = step(pool, 5)
    assert ret.answers == [pids[0]] * 3 + [pids[1]] * 2  # contiguous: 3 + 2
    assert [m["i"] for m in ret.metadata] == [0, 1, 2, 3, 4] and ret.rewards.tolist() == [1.0] * 5
    assert ret.reward_components["one"].tolist() == [1.0] * 5
    assert pool.reward_component_names == ("one",)
    batch = EnvBatch(torch.arange(2), torch.zeros(2, dtype=torch.bool), torch.ones(2), torch.ones(2))
    assert pool.metrics(torch.ones(2), batch) == {"pid": float(pids[0]), "seen": 2.0}  # run in an actor


def test_an_actor_killed_between_steps_is_restarted_and_the_next_step_waits_for_it(pool):
    before = pool.placement()[0]["pid"]
    os.kill(before, signal.SIGKILL)
    ret = step(pool, 2)  # one sample per actor; actor 0 answers once Ray has restarted it
    after = pool.placement()[0]["pid"]
    assert after != before and ret.answers[0] == str(after)
    assert pool.take_deaths() == 0  # nothing was in flight


def test_the_samples_an_actor_held_when_it_died_fail_and_the_pool_goes_on(pool):
    pids = [w["pid"] for w in pool.placement()]
    with pytest.raises(EnvActorDied, match="'pid' #0 died during the step") as e:
        pool.step([[{"role": "assistant", "content": "1"}]] * 4, [{"die": True}, {}, {}, {}])
    assert e.value.rows == [0, 1]  # actor 0's chunk; actor 1's samples were scored (and are stepped again)
    assert pool.take_deaths() == 1 and pool.take_deaths() == 0
    ret = step(pool, 4)
    new = pool.placement()
    assert new[0]["pid"] != pids[0] and new[1]["pid"] == pids[1]
    assert ret.answers == [str(new[0]["pid"])] * 2 + [str(pids[1])] * 2
    pool.renew()  # a retry's fresh environments: every actor rebuilds its own
    assert step(pool, 2).rewards.tolist() == [1.0, 1.0]


def test_an_actor_that_dies_in_metrics_is_counted_and_asked_again_once_restarted(pool, source_dir):
    before = pool.placement()[0]["pid"]
    pool.take_deaths()
    (source_dir / "die_in_metrics").write_text("")  # metrics() removes it, then kills its process
    batch = EnvBatch(torch.arange(3), torch.zeros(3, dtype=torch.bool), torch.ones(3), torch.ones(3))
    out = pool.metrics(torch.ones(3), batch)
    after = pool.placement()[0]["pid"]
    assert after != before and out == {"pid": float(after), "seen": 3.0}  # the restarted actor's answer
    assert pool.take_deaths() == 1 and pool.take_deaths() == 0
