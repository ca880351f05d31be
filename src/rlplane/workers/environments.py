"""The environments a rollout steps: each task's actor pool (``runtime: ray``), else instances made in this process.

An instance belongs to a task and a slot, a set of instances that one thread steps (async GRPO scores one batch
while the next generates), so an environment never needs to be thread-safe; the caller names the slot.
Held-out rollouts use ``env.val_task_to_env``'s environments.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field

from rlplane.config.envs import EnvConfig
from rlplane.envs import create_env
from rlplane.envs.user import register_user_tasks
from rlplane.runtime.env_pools import EnvPool, pool_name
from rlplane.workers.env_steps import EnvSteps


@dataclass(frozen=True)
class EnvBlock:
    """``config``: the ``env`` section (each task's environment, its settings, the step deadline); ``pools``: the
    driver's actor pools by pool name (``runtime: ray``; none: every environment in this process)."""

    config: EnvConfig
    pools: Mapping[str, EnvPool] = field(default_factory=dict)


class Environments:
    """The environment of each (task, slot); ``retries``: re-runs of a failed step on a fresh instance."""

    def __init__(self, block: EnvBlock, retries: int = 0):
        self.config, self.pools, self.retries = block.config, dict(block.pools), retries
        self.instances: dict[tuple[str, int], object] = {}  # (pool name, slot) -> instance, made on first use
        register_user_tasks(block.config, import_now=True)  # env.<task>.reward_fn / class: imported in this process

    def get(self, task_name: str, validation: bool = False, slot: int = 0):
        """The environment for ``task_name``: its actor pool, else slot ``slot``'s instance."""
        name = pool_name(task_name, validation, self.config.val_task_to_env)
        if name in self.pools:
            return self.pools[name]
        if (name, slot) not in self.instances:
            env_name = self.config.val_task_to_env[task_name] if name != task_name else task_name
            self.instances[name, slot] = create_env(env_name, **self.config.env_kwargs(env_name))
        return self.instances[name, slot]

    def renew(self, task_name: str, validation: bool = False, slot: int = 0):
        """A fresh environment for ``task_name`` in slot ``slot`` (the old one closed), for a retry; a pool's actors
        each build a fresh one."""
        name = pool_name(task_name, validation, self.config.val_task_to_env)
        if name in self.pools:
            return self.pools[name].renew()
        _close(self.instances.pop((name, slot), None))
        return self.get(task_name, validation, slot)

    def any(self, task_name: str, validation: bool = False):
        """An instance of ``task_name`` of any slot (a pool: itself), made in slot 0 if there is none."""
        name = pool_name(task_name, validation, self.config.val_task_to_env)
        if name in self.pools:
            return self.pools[name]
        return next((e for (task, _), e in list(self.instances.items()) if task == name), None) or self.get(
            task_name, validation)

    def pool(self, task_name: str, validation: bool = False) -> EnvPool | None:
        return self.pools.get(pool_name(task_name, validation, self.config.val_task_to_env))

    def steps(self, validation: bool = False, slot: int = 0) -> EnvSteps:
        """How the turn loop steps these environments, in slot ``slot``."""
        return EnvSteps(functools.partial(self.get, validation=validation, slot=slot),
                        functools.partial(self.renew, validation=validation, slot=slot),
                        self.retries, self.config.step_timeout_s, concurrent=bool(self.pools))

    def close(self) -> None:
        """Close the instances that hold resources (verifier or sandbox worker processes)."""
        for env in self.instances.values():
            _close(env)
        self.instances.clear()


def _close(env) -> None:
    close = getattr(env, "close", None)
    if close is not None:
        close()
