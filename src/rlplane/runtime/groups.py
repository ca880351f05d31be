"""Where workers run: the same worker classes in-process (`local`) or as Ray actors (`ray`).

A group (one worker per DP rank) calls a method on all ranks and returns results in rank order; a single
actor is called like an object. A call names the worker's method itself (``group.run(PolicyWorker.save, path)``),
never its name as a string, so a reader and every tool can follow it; the name crosses to Ray here only.
Workers do not know their runtime, and nothing above imports Ray. ``lazy(method)`` returns the value locally or
an object reference under Ray, resolved in the actor it is passed to (weights go from policy to generator
without the driver).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from rlplane.dataplane import DataPlaneClient, KVBatchMeta, shard_meta_for_dp
from rlplane.errors import ConfigError, WorkerFailed
from rlplane.fast.heap import freeze_actor_heap
from rlplane.runtime.calls import method_name
from rlplane.runtime.interrupts import StopSignals
from rlplane.runtime.process_actor import ProcessActor
from rlplane.runtime.watchdog import Watchdog, install_stack_dump, tracker
from rlplane.runtime.worker_env import WORKER_ENV
from rlplane.utils.reachable import check_server

# An actor that has not started by then never will: fail, do not hang.
ACTOR_START_TIMEOUT_S = 300.0



def _per_rank_shards(meta: KVBatchMeta, world: int, batch_size: int | None) -> list[dict]:
    metas, _ = shard_meta_for_dp(meta, world, batch_size=batch_size)
    return [{"meta": m} for m in metas]


def worker_died(e: BaseException, label: str, method: str) -> WorkerFailed:
    """The one line for a Ray actor that died (or was killed) while ``method`` ran or was queued on it."""
    detail = " ".join(str(e).split())
    why = "killed" if "ray.kill" in detail else "its process exited" if "process has died" in detail else "died"
    return WorkerFailed(f"{label} died during {method} ({why}); the run stops: resume from its last checkpoint "
                        "with checkpointing.resume=true")


def _dead_among(where: dict, method: str, timeout_s: float = 5.0) -> WorkerFailed | None:
    """The one line for the first actor of ``where`` (ref -> (label, actor)) found dead within ``timeout_s``."""
    import ray

    if not where:
        return None
    ready, _ = ray.wait(list(where), num_returns=len(where), timeout=timeout_s)
    for ref in ready:
        try:
            ray.get(ref, timeout=0)
        except ray.exceptions.RayActorError as e:
            return worker_died(e, where[ref][0], method)
        except Exception:  # noqa: BLE001, S110 - that rank's own error: not a death
            pass
    return None


class LocalGroup:
    """Workers constructed in this process; calls run one after the other. ``cls``: their class (whose methods a
    call names); ``name`` labels rank ``i`` as ``{name} {i}`` for the run's ``watchdog`` (None: unwatched)."""

    def __init__(self, cls: type, per_rank_kwargs: list[dict[str, Any]], name: str | None = None,
                 watchdog: Watchdog | None = None):
        self.cls, self.name = cls, name or cls.__name__
        self._track = tracker(watchdog)
        self.workers = [cls(**kw) for kw in per_rank_kwargs]

    def __len__(self) -> int:
        return len(self.workers)

    def run(self, method: Callable, *args, per_rank: list[dict] | None = None, **kwargs) -> list:
        name = method_name(method)
        with self._track(self.name, name):
            return [getattr(w, name)(*args, **kwargs, **(per_rank[i] if per_rank else {}))
                    for i, w in enumerate(self.workers)]

    def run_sharded(self, method: Callable, meta: KVBatchMeta, batch_size: int | None = None, **kwargs) -> list:
        """Shard ``meta`` over the ranks (:func:`shard_meta_for_dp`) and call ``method`` on each with its shard."""
        name = method_name(method)
        shards = _per_rank_shards(meta, len(self.workers), batch_size)
        results = []
        with self._track(self.name, name):
            for worker, shard in zip(self.workers, shards):  # a plain loop: one frame less to the worker
                results.append(getattr(worker, name)(**kwargs, **shard))
        return results

    def lazy(self, method: Callable, *args, rank: int = 0, **kwargs):
        name = method_name(method)
        with self._track(f"{self.name} {rank}", name):
            return getattr(self.workers[rank], name)(*args, **kwargs)

    def wait(self, handles: list) -> list:
        """The results of calls made with :meth:`lazy` (already computed in this process)."""
        return handles

    def close(self) -> None:
        pass


class RayGroup:
    """One Ray actor per rank; calls go to all ranks at once. ``distributed``: ranks join one gloo group.

    ``data_plane``: the driver's client; metas go out through its ``located`` and results come back through
    its ``commit_receipts``; ``watchdog``: the run's (None: unwatched)."""

    def __init__(self, cls: type, per_rank_kwargs: list[dict[str, Any]], num_cpus: float = 1.0,
                 distributed: bool = False, num_gpus: float = 0.0, scheduling: list | None = None,
                 env_vars: dict[str, str] | None = None, data_plane: DataPlaneClient | None = None,
                 name: str | None = None, watchdog: Watchdog | None = None):
        import ray

        self.data_plane, self.watchdog = data_plane, watchdog
        self.cls, self.name = cls, name or cls.__name__
        self._track = tracker(watchdog)

        remote_cls = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus,
                                runtime_env={"env_vars": {**WORKER_ENV, **(env_vars or {})}})(cls)
        # ``scheduling``: a placement-group bundle per rank; None: wherever Ray puts it.
        self.workers = [
            (remote_cls.options(scheduling_strategy=scheduling[i]) if scheduling else remote_cls).remote(**kw)
            for i, kw in enumerate(per_rank_kwargs)
        ]
        await_actors(self.workers)
        self.labels = {w._actor_id.hex(): f"{self.name} {i}" for i, w in enumerate(self.workers)}
        self._by_id = {w._actor_id.hex(): w for w in self.workers}
        self._lazy: dict[str, str] = {}  # a lazy call's object ref (hex) -> its method, for wait (the latest few)
        for w in self.workers if watchdog is not None else ():  # its stacks on SIGUSR1, for the watchdog
            watchdog.register_actor(self.labels[w._actor_id.hex()], w.__ray_call__.remote(install_stack_dump))
        # Each actor's model and imports out of full GC's reach (rlplane.fast.heap).
        ray.get([w.__ray_call__.remote(freeze_actor_heap) for w in self.workers])
        if distributed:  # its own process group (gloo/NCCL): every actor is its own process
            self.run(cls.setup_distributed, ray.get(self.workers[0].node_address.remote()))

    def __len__(self) -> int:
        return len(self.workers)

    def run(self, method: Callable, *args, per_rank: list[dict] | None = None, **kwargs) -> list:
        import ray

        name = method_name(method)
        refs = [
            getattr(w, name).remote(*args, **kwargs, **(per_rank[i] if per_rank else {}))
            for i, w in enumerate(self.workers)
        ]
        return self._received(self._get(refs, name, ray.get))

    def run_sharded(self, method: Callable, meta: KVBatchMeta, batch_size: int | None = None, **kwargs) -> list:
        """Shard ``meta`` over the ranks and call ``method`` on each with its located shard; receipts are taken
        before this returns."""
        import ray

        name = method_name(method)
        shards = _per_rank_shards(meta, len(self.workers), batch_size)
        if self.data_plane is not None:
            shards = [{"meta": self.data_plane.located(shard["meta"])} for shard in shards]
        refs = [getattr(w, name).remote(**kwargs, **shards[i]) for i, w in enumerate(self.workers)]
        return self._received(self._get(refs, name, ray.get))

    def lazy(self, method: Callable, *args, rank: int = 0, **kwargs):
        name = method_name(method)
        ref = getattr(self.workers[rank], name).remote(*args, **kwargs)
        self._lazy[ref.hex()] = name  # a hex, not the ref: holding it would pin the result in the object store
        if len(self._lazy) > 64:  # refs handed to other actors are never waited for here
            self._lazy.pop(next(iter(self._lazy)))
        return ref

    def wait(self, handles: list) -> list:
        """The results of calls started with :meth:`lazy` (a deadline hit in an actor comes out as one line)."""
        from rlplane.runtime.deadlines import ray_get

        methods = [self._lazy.pop(h.hex(), None) for h in handles]
        method = next((m for m in methods if m is not None), "a call")
        where = {}
        for h in handles:
            actor = h.task_id().actor_id().hex()
            if actor in self._by_id:
                where[h] = (self.labels[actor], self._by_id[actor])
        return self._received(self._get(handles, method, ray_get, where))

    def _get(self, refs: list, method: str, get, where: dict | None = None) -> list:
        """``get(refs)``, watched (:mod:`~rlplane.runtime.watchdog`); an actor that died is one line naming it."""
        import ray

        if where is None:
            where = {r: (self.labels[w._actor_id.hex()], w) for r, w in zip(refs, self.workers)}
        with self._track(self.name, method, where):
            try:
                return get(refs)
            except ray.exceptions.RayActorError as e:
                label = self.labels.get(e.actor_id or "", f"a {self.name} worker")
                raise worker_died(e, label, method) from None
            except ray.exceptions.RayTaskError:
                # A rank whose peer died fails too (a collective with a dead rank): name the dead one.
                if (dead := _dead_among(where, method)) is not None:
                    raise dead from None
                raise

    def _received(self, results: list) -> list:
        """``results`` with the write receipts in them replaced by those the driver's index gave back."""
        if self.data_plane is not None:
            return self.data_plane.commit_receipts(results)
        return results

    def close(self) -> None:
        import ray

        for w in self.workers:
            if self.watchdog is not None:
                self.watchdog.forget_actor(self.labels[w._actor_id.hex()])
            ray.kill(w)

    kill = close


class LocalActor:
    """One worker in this process. ``obj`` is the worker itself (colocated parts may share its module)."""

    def __init__(self, cls: type, kwargs: dict[str, Any], name: str | None = None, watchdog: Watchdog | None = None):
        self.obj = cls(**kwargs)
        self.name = name or cls.__name__
        self._track = tracker(watchdog)

    def call(self, method: Callable, *args, **kwargs):
        name = method_name(method)
        with self._track(self.name, name):
            return getattr(self.obj, name)(*args, **kwargs)

    lazy = call

    def share(self, name: str, tensors):
        """An argument for :meth:`call` holding ``tensors`` (here themselves; a process actor stages them)."""
        return tensors

    def close(self) -> None:
        close = getattr(self.obj, "close", None)
        if close is not None:
            close()


class RayActor:
    """One worker as a Ray actor; ``max_concurrency`` > 1 lets its own threads run beside calls."""

    obj = None  # the worker lives in another process

    def __init__(self, cls: type, kwargs: dict[str, Any], num_cpus: float = 0.5, max_concurrency: int | None = None,
                 env_vars: dict[str, str] | None = None, name: str | None = None, num_gpus: float = 0.0,
                 watchdog: Watchdog | None = None):
        import ray

        self.name, self.watchdog = name or cls.__name__, watchdog
        self._track = tracker(watchdog)

        options: dict[str, Any] = dict(num_cpus=num_cpus, num_gpus=num_gpus,
                                       runtime_env={"env_vars": {**WORKER_ENV, **(env_vars or {})}})
        if max_concurrency is not None:
            options["max_concurrency"] = max_concurrency
        self.handle = ray.remote(**options)(cls).remote(**kwargs)
        # Queued after the constructor, not awaited (the first call reports a constructor that raised).
        self.handle.__ray_call__.remote(freeze_actor_heap)
        if watchdog is not None:
            watchdog.register_actor(self.name, self.handle.__ray_call__.remote(install_stack_dump))

    def call(self, method: Callable, *args, **kwargs):
        import ray

        from rlplane.runtime.deadlines import ray_get

        name = method_name(method)
        ref = getattr(self.handle, name).remote(*args, **kwargs)
        with self._track(self.name, name, {ref: (self.name, self.handle)}):
            try:  # a deadline hit inside the actor comes out as its own one line, not Ray's traceback
                return ray_get(ref)
            except ray.exceptions.RayActorError as e:
                raise worker_died(e, self.name, name) from None

    def lazy(self, method: Callable, *args, **kwargs):
        return getattr(self.handle, method_name(method)).remote(*args, **kwargs)

    def share(self, name: str, tensors):
        """An argument for :meth:`call` holding ``tensors`` (as given: an object reference stays one)."""
        return tensors

    def close(self) -> None:
        import ray

        if self.watchdog is not None:
            self.watchdog.forget_actor(self.name)
        ray.kill(self.handle)  # the actor's processes (and its envs' workers) go with it


def make_group(runtime: str, cls: type, per_rank_kwargs: list[dict[str, Any]], *, num_cpus: float = 1.0,
               num_gpus: float = 0.0, distributed: bool = False, scheduling: list | None = None,
               env_vars: dict[str, str] | None = None, data_plane: DataPlaneClient | None = None,
               name: str | None = None, watchdog: Watchdog | None = None) -> LocalGroup | RayGroup:
    """A group of ``cls`` workers, one per ``per_rank_kwargs`` entry, under ``runtime`` (local | ray).

    Ray: ``distributed`` joins a process group, ``scheduling`` places rank ``i``, ``env_vars`` go to the
    actors, ``data_plane`` locates metas and takes receipts. Locally workers hold the driver's own client.
    ``name`` labels rank ``i`` as ``{name} {i}`` in errors and the verdict of the run's ``watchdog``."""
    if runtime == "local":
        return LocalGroup(cls, per_rank_kwargs, name=name, watchdog=watchdog)
    return RayGroup(cls, per_rank_kwargs, num_cpus=num_cpus, num_gpus=num_gpus, distributed=distributed,
                    scheduling=scheduling, env_vars=env_vars, data_plane=data_plane, name=name, watchdog=watchdog)


def make_actor(runtime: str, cls: type, kwargs: dict[str, Any], *, num_cpus: float = 0.5, num_gpus: float = 0.0,
               max_concurrency: int | None = None, env_vars: dict[str, str] | None = None, process: bool = False,
               setup: Sequence[tuple[Callable, tuple]] = (), name: str | None = None,
               watchdog: Watchdog | None = None):
    """A single ``cls`` worker under ``runtime``; ``process`` (local only): in a child process of its own
    (:class:`~rlplane.runtime.process_actor.ProcessActor`, ``setup`` run there first); ``num_gpus``: Ray only."""
    if runtime == "local" and process:
        return ProcessActor(cls, kwargs, setup=setup)
    if runtime == "local":
        return LocalActor(cls, kwargs, name=name, watchdog=watchdog)
    return RayActor(cls, kwargs, num_cpus=num_cpus, max_concurrency=max_concurrency, env_vars=env_vars, name=name,
                    num_gpus=num_gpus, watchdog=watchdog)


def await_actors(actors: list, timeout_s: float = ACTOR_START_TIMEOUT_S) -> None:
    """Wait until every actor answers ``ping``; a one-line error after ``timeout_s`` instead of a hang."""
    import ray

    refs = [a.ping.remote() for a in actors]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if len(ready) < len(refs):
        raise ConfigError([
            f"runtime=ray: {len(refs) - len(ready)} of {len(refs)} worker actors did not start within {timeout_s:g} s "
            "(the Ray cluster lacks free CPUs or memory for them); free the cluster, lower policy.dp_size, or give Ray "
            "more (cluster.num_cpus, cluster.address)"
        ])
    ray.get(ready)  # a constructor that raised raises here


def cluster_cpus() -> float:
    """The CPUs of the Ray cluster this process is connected to."""
    import ray

    return float(ray.cluster_resources().get("CPU", 0))


def cluster_gpus() -> float:
    """The GPUs of the Ray cluster this process is connected to."""
    import ray

    return float(ray.cluster_resources().get("GPU", 0))


def init_ray(num_cpus: int | None = None, address: str | None = None, num_gpus: int | None = None,
             connect_timeout_s: float = 30.0, signals: StopSignals | None = None) -> None:
    """Start (or join) Ray once per process, quietly and without the dashboard; a head at ``address`` must answer
    within ``connect_timeout_s`` (``cluster.connect_timeout_s``); ``signals``: the run's stop signals, which Ray's
    own processes must not take and whose handlers ``ray.init`` replaces."""
    signals = signals or StopSignals()  # not installed: nothing to keep
    import tempfile

    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": WORKER_ENV})
    # cluster.address, else Ray's own RAY_ADDRESS (which ray.init would read itself); "local" starts one here.
    key, target = ("cluster.address", address) if address else ("RAY_ADDRESS", os.environ.get("RAY_ADDRESS"))
    if target and target not in ("auto", "local"):  # ray.init retries an address with no GCS behind it forever
        check_server(target, 10001 if target.startswith("ray://") else 6379, key,
                     "start the cluster (ray start --head) or fix the address" + (
                         "; null runs a local Ray" if address else ", or unset it to run a local Ray"),
                     protocol="grpc", timeout_s=connect_timeout_s, timeout_key="cluster.connect_timeout_s")
    if target and target != "local":
        if not address and (num_cpus or num_gpus):
            raise ConfigError([f"RAY_ADDRESS={target!r} (environment) joins that cluster, which brings its own "
                               "resources: unset cluster.num_cpus and cluster.gpus_per_node, or unset RAY_ADDRESS"])
        try:
            ray.init(address=target, **kwargs)
        except (ConnectionError, RuntimeError) as e:  # reachable, but no Ray would talk to us (auth, version)
            cause = " ".join(str(e.__cause__ or e).split())[:300]
            raise ConfigError([f"{key} = {target!r}: Ray did not accept the connection ({cause}); check the address, "
                               "and for a cluster with token authentication set RAY_AUTH_TOKEN"]) from None
    else:
        with signals.children_ignore_sighup():  # Ray's own processes are in the driver's process group
            ray.init(num_cpus=num_cpus, num_gpus=num_gpus, _temp_dir=tempfile.mkdtemp(prefix="rlplane-ray-"), **kwargs)
    signals.reinstall()  # ray.init set its own SIGTERM handler in the driver


def spread(num_items: int, num_workers: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, end)`` ranges, sizes within one, larger first: ``spread(5, 2) == [(0, 3), (3, 5)]``."""
    base, extra = divmod(num_items, num_workers)
    out, start = [], 0
    for w in range(num_workers):
        end = start + base + (w < extra)
        out.append((start, end))
        start = end
    return out
