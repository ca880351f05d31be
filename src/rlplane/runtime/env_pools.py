"""Environments as Ray actors (``runtime: ray``): one pool of actors per environment, by ``task_name``.

A task's batch is split contiguously over its pool's actors and the calls run at once. A dead actor is
restarted by Ray (``max_restarts=-1``, no task retries); the samples it held fail with :class:`EnvActorDied`
and follow ``rollout_failure_policy``; later calls wait for the restart (``RESTART_TIMEOUT_S``). A death
during a step or a ``metrics()`` call is counted (``take_deaths``); ``metrics()`` is asked again.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rlplane.envs.interface import EnvBatch, EnvironmentReturn, default_env_metrics
from rlplane.envs.registry import create_env, restore_env_registry
from rlplane.errors import WorkerFailed
from rlplane.runtime.groups import spread

RESTART_TIMEOUT_S = 120.0
VAL_PREFIX = "val/"


class EnvActorDied(RuntimeError):
    """Environment actors died during a step; ``rows``: the batch positions of the samples they held."""

    def __init__(self, message: str, rows: Sequence[int]):
        super().__init__(message)
        self.rows = list(rows)


def pool_name(task_name: str, validation: bool, val_task_to_env: Mapping[str, str]) -> str:
    """The pool (or in-process environment key) that steps ``task_name``'s samples."""
    return VAL_PREFIX + task_name if validation and task_name in val_task_to_env else task_name


def pool_env_names(task_names: Sequence[str], val_task_to_env: Mapping[str, str]) -> dict[str, str]:
    """Pool name -> the environment it runs: one per task, and ``val/<task>`` for each validation mapping."""
    out = {t: t for t in dict.fromkeys(task_names)}
    out.update({VAL_PREFIX + t: env for t, env in val_task_to_env.items()})
    return out


def call_env_metrics(env: Any, rewards: torch.Tensor, batch: EnvBatch) -> dict[str, float]:
    """``env.metrics(rewards, batch)``; a one-argument override gets the rewards, an env without one the default."""
    fn = getattr(env, "metrics", None)
    if fn is None:
        return default_env_metrics(rewards, batch)
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
        takes_batch = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
                          for p in params) >= 2
    except (TypeError, ValueError):
        takes_batch = True
    return dict(fn(rewards, batch) if takes_batch else fn(rewards))


class EnvActor:
    """One environment in a Ray actor, built from the driver's registry snapshot and user tasks (``env_cfg``).
    Two threads, so ``ping`` answers during a long step; the lock keeps the environment's calls one at a time."""

    def __init__(self, pool: str, env_name: str, kwargs: dict[str, Any], registry: dict[str, Any], env_cfg=None):
        from rlplane.envs.user import register_user_tasks

        restore_env_registry(registry)
        if env_cfg is not None:
            register_user_tasks(env_cfg)
        self.pool, self.env_name, self.kwargs = pool, env_name, dict(kwargs)
        self.env = create_env(env_name, **self.kwargs)
        self._lock = threading.Lock()

    def ping(self) -> int:
        return os.getpid()

    def reward_component_names(self) -> tuple[str, ...]:
        return tuple(getattr(self.env, "reward_component_names", ()))

    def step(self, message_logs, metadata) -> EnvironmentReturn:
        with self._lock:
            return self.env.step(message_logs, metadata)

    def metrics(self, rewards: torch.Tensor, batch: EnvBatch) -> dict[str, float]:
        with self._lock:
            return call_env_metrics(self.env, rewards, batch)

    def reset(self) -> int:
        """A fresh environment in place of the current one (closed): a failed step's retry."""
        with self._lock:
            self._close()
            self.env = create_env(self.env_name, **self.kwargs)
        return os.getpid()

    def placement(self) -> dict:
        import ray

        return {"pool": self.pool, "env": self.env_name, "node_id": ray.get_runtime_context().get_node_id(),
                "pid": os.getpid()}

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        close = getattr(self.env, "close", None)
        if close is not None:
            close()


@dataclass
class EnvPool:
    """One environment's actors, used like one environment; plain data, sent to every rollout worker."""

    name: str
    env_name: str
    actors: list
    remote = True  # steps of several pools may run at once (workers/env_steps.py)
    _components: tuple[str, ...] | None = field(default=None, repr=False)
    _deaths: int = field(default=0, repr=False)  # actors seen dead by this copy's steps, since take_deaths

    @property
    def reward_component_names(self) -> tuple[str, ...]:
        if self._components is None:
            import ray

            self._components = ray.get(self._ready(0).reward_component_names.remote())
        return self._components

    def step(self, message_logs: Sequence, metadata: Sequence) -> EnvironmentReturn:
        """The batch split over the actors, stepped at once, joined in order; :class:`EnvActorDied` names the
        rows of actors that died."""
        import ray

        n = len(message_logs)
        if n == 0:
            return EnvironmentReturn([], [], [], torch.zeros(0), torch.zeros(0, dtype=torch.bool), [])
        spans = [(j, a, b) for j, (a, b) in enumerate(spread(n, len(self.actors))) if b > a]
        refs, dead = {}, {}
        for j, a, b in spans:
            try:
                refs[j] = self._ready(j).step.remote(list(message_logs[a:b]), list(metadata[a:b]))
            except EnvActorDied as e:
                dead[j] = str(e)
        parts = {}
        for j, ref in refs.items():
            try:
                parts[j] = ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as e:
                dead[j] = (f"environment actor {self.name!r} #{j} died during the step ({_first_line(e)}); "
                           "Ray restarts it")
            except ray.exceptions.RayTaskError as e:  # the environment raised: as it would in-process
                raise (e.cause if isinstance(e.cause, Exception) else e.as_instanceof_cause()) from None
        if dead:
            self._deaths += len(dead)
            rows = [i for j, a, b in spans if j in dead for i in range(a, b)]
            raise EnvActorDied(next(iter(dead.values())), rows)
        if len(spans) == 1:
            return parts[spans[0][0]]
        return join_returns([parts[j] for j, _, _ in spans], [metadata[a:b] for _, a, b in spans])

    def metrics(self, rewards: torch.Tensor, batch: EnvBatch) -> dict[str, float]:
        """The environment's metrics from actor 0; an actor that dies during the call is counted with the step's
        deaths and asked again once Ray has restarted it (metrics are a function of their arguments)."""
        import ray

        tries = 0
        while True:
            try:
                return ray.get(self._ready(0).metrics.remote(rewards, batch))
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as e:
                self._deaths, tries = self._deaths + 1, tries + 1
                if tries > 1:
                    raise EnvActorDied(f"environment actor {self.name!r} #0 died during metrics() twice "
                                       f"({_first_line(e)})", []) from None
            except ray.exceptions.RayTaskError as e:  # the environment raised: as it would in-process
                raise (e.cause if isinstance(e.cause, Exception) else e.as_instanceof_cause()) from None

    def take_deaths(self) -> int:
        """Actor deaths this copy's steps met since the last call (the rollout reports them)."""
        n, self._deaths = self._deaths, 0
        return n

    def renew(self) -> EnvPool:
        """Every actor builds a fresh environment (a gone actor is left to fail its samples at the step)."""
        import ray

        refs = []
        for j in range(len(self.actors)):
            try:
                refs.append(self._ready(j).reset.remote())
            except EnvActorDied:
                continue
        ray.wait(refs, num_returns=len(refs))
        return self

    def placement(self) -> list[dict]:
        import ray

        return [{**p, "actor": j} for j, p in enumerate(ray.get([a.placement.remote() for a in self.actors]))]

    def close(self) -> None:
        import ray

        refs = [a.close.remote() for a in self.actors]
        ray.wait(refs, num_returns=len(refs), timeout=10.0)  # environments that hold processes close them
        for a in self.actors:
            ray.kill(a)

    def _ready(self, j: int, timeout_s: float = RESTART_TIMEOUT_S):
        """Actor ``j`` once it answers (waiting while Ray restarts it); :class:`EnvActorDied` if it does not."""
        import ray

        actor, deadline = self.actors[j], time.monotonic() + timeout_s
        while True:
            try:
                ray.get(actor.ping.remote(), timeout=max(deadline - time.monotonic(), 0.01))
                return actor
            except ray.exceptions.ActorUnavailableError:  # restarting
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                raise EnvActorDied(f"environment actor {self.name!r} #{j} is gone and was not restarted "
                                   f"({_first_line(e)})", []) from None
        raise EnvActorDied(f"environment actor {self.name!r} #{j} did not come back within {timeout_s:g} s of a "
                           "restart", [])


def start_env_pools(specs: Mapping[str, tuple[str, int]], kwargs_of, registry: dict[str, Any], env_cfg=None,
                    num_cpus: float = 0.0, env_vars: dict[str, str] | None = None) -> dict[str, EnvPool]:
    """``n`` :class:`EnvActor` per pool ``name -> (environment, n)``, created, not awaited (:func:`await_env_pools`)."""
    import ray

    from rlplane.runtime.worker_env import WORKER_ENV

    remote = ray.remote(num_cpus=num_cpus, max_restarts=-1, max_task_retries=0, max_concurrency=2,
                        runtime_env={"env_vars": {**WORKER_ENV, **(env_vars or {})}})(EnvActor)
    return {name: EnvPool(name, env, [remote.remote(name, env, kwargs_of(env), registry, env_cfg) for _ in range(n)])
            for name, (env, n) in specs.items() if n > 0}


def await_env_pools(pools: Mapping[str, EnvPool], timeout_s: float = RESTART_TIMEOUT_S) -> None:
    """Wait until every actor of ``pools`` has built its environment (a constructor that raised raises here);
    :class:`WorkerFailed` naming the late ones after ``timeout_s`` (``env.start_timeout_s``)."""
    if not pools:  # runtime: local has none; ray.wait would start a Ray instance of its own
        return
    import ray

    names = [f"{p.name!r} #{j}" for p in pools.values() for j in range(len(p.actors))]
    refs = [a.ping.remote() for p in pools.values() for a in p.actors]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if len(ready) < len(refs):
        late = [name for name, ref in zip(names, refs) if ref not in ready]
        raise WorkerFailed(f"environment actors {', '.join(late[:4])}{' ...' if len(late) > 4 else ''} ({len(late)} "
                           f"of {len(refs)}) did not start within {timeout_s:g} s (env.start_timeout_s = "
                           f"{timeout_s:g}): a constructor that waits on a server, or a Ray cluster with no room for "
                           "them; raise env.start_timeout_s, free the cluster or lower env.actors_per_env")
    ray.get(refs)


def join_returns(parts: Sequence[EnvironmentReturn], metadata: Sequence[Sequence]) -> EnvironmentReturn:
    """Consecutive chunks' returns as one; a chunk's None metadata (unchanged) becomes its input ``metadata``."""
    sizes = [len(m) for m in metadata]

    def joined(name: str, fill):
        values = [getattr(p, name) for p in parts]
        if all(v is None for v in values):
            return None
        return [x for v, f in zip(values, fill) for x in (f if v is None else list(v))]

    names = dict.fromkeys(k for p in parts for k in (p.reward_components or {}))
    components = {k: torch.cat([torch.as_tensor((p.reward_components or {}).get(k, torch.zeros(s)),
                                                 dtype=torch.float32).reshape(-1) for p, s in zip(parts, sizes)])
                  for k in names} or None
    return EnvironmentReturn(
        observations=joined("observations", [[None] * s for s in sizes]),
        metadata=joined("metadata", [list(m) for m in metadata]),
        next_stop_strings=joined("next_stop_strings", [[None] * s for s in sizes]),
        rewards=torch.cat([torch.as_tensor(p.rewards, dtype=torch.float32).reshape(-1) for p in parts]),
        terminateds=torch.cat([torch.as_tensor(p.terminateds, dtype=torch.bool).reshape(-1) for p in parts]),
        answers=joined("answers", [[None] * s for s in sizes]),
        reward_components=components,
    )


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__
