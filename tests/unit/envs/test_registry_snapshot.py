"""The environment registry as it travels to a worker process (the async collector's): entries
registered at run time go along by reference; one that cannot be pickled says so when it is built."""

from __future__ import annotations

import pickle

import pytest

from rlplane.envs import ArithmeticEnv
from rlplane.envs.registry import (
    ENV_REGISTRY,
    UnknownEnvironmentError,
    create_env,
    env_registry_snapshot,
    register_env,
    restore_env_registry,
)


@pytest.fixture
def registry():
    saved = dict(ENV_REGISTRY)
    yield
    ENV_REGISTRY.clear()
    ENV_REGISTRY.update(saved)


def test_snapshot_round_trips_through_pickle(registry):
    register_env("mine", ArithmeticEnv)
    snapshot = pickle.loads(pickle.dumps(env_registry_snapshot()))  # what the child process unpickles
    ENV_REGISTRY.clear()
    restore_env_registry(snapshot)
    assert ENV_REGISTRY["mine"] is ArithmeticEnv
    assert ENV_REGISTRY["arithmetic"] == "rlplane.envs.arithmetic:ArithmeticEnv"


def test_an_unpicklable_factory_fails_in_the_worker_with_one_line(registry):
    register_env("lambda_env", lambda **kw: ArithmeticEnv(**kw))
    snapshot = pickle.loads(pickle.dumps(env_registry_snapshot()))
    restore_env_registry(snapshot)
    with pytest.raises(UnknownEnvironmentError) as e:
        create_env("lambda_env")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("task_name 'lambda_env': its environment factory")
    assert "grpo.async_grpo.collector_process=false" in msg
