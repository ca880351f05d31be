"""The session's workers, as the run plan's role table names them: the policy ranks, the generators, the environment
actor pools (``runtime: ray``), and the critic and frozen teacher where the recipe has them, all through
:mod:`rlplane.runtime.groups` (in-process or Ray actors in placement groups; environment actors:
:mod:`rlplane.runtime.env_pools`). Before any starts under Ray, :func:`check_ray_resources` and
:func:`check_placement` hold the plan against the cluster."""

from __future__ import annotations

from rlplane.config.envs import EnvConfig
from rlplane.config.schema import RunConfig
from rlplane.dataplane import DataPlaneClient
from rlplane.envs.registry import env_registry_snapshot, reward_component_names
from rlplane.envs.user import import_path_env, user_task_error_in
from rlplane.errors import ConfigError
from rlplane.runtime import placement
from rlplane.runtime.devices import check_cluster_gpus
from rlplane.runtime.env_pools import EnvPool, await_env_pools, start_env_pools
from rlplane.runtime.groups import cluster_cpus as ray_cluster_cpus, cluster_gpus as ray_cluster_gpus, make_group
from rlplane.runtime.watchdog import Watchdog
from rlplane.training.generators import Generators
from rlplane.training.plan import RunPlan
from rlplane.workers.environments import EnvBlock
from rlplane.workers.policy import PolicyWorker
from rlplane.workers.rollout import RolloutWorker
from rlplane.workers.teacher import TeacherWorker
from rlplane.workers.value import ValueWorker


def ray_cpu_demand(plan: RunPlan) -> float:
    """CPUs the run's Ray actors ask for together (Ray never schedules an actor it cannot fit)."""
    return sum(r.count * r.cpus for r in plan.roles)


def check_gdpo_components(cfg: RunConfig, task_names) -> None:
    """GDPO normalises each reward component: every environment the data names gives at least 2. Checked at
    start-up, where the environments are known (the config sits below them), user tasks registered by then."""
    if cfg.algorithm != "grpo" or cfg.grpo.adv_estimator.name != "gdpo":
        return
    errors = []
    for task in dict.fromkeys(task_names):
        names = reward_component_names(task)
        if names is not None and len(names) < 2:
            errors.append(
                f"grpo.adv_estimator.name = gdpo: environment {task!r} gives {len(names)} reward components "
                f"{list(names)}, GDPO needs at least 2 (task 'arithmetic' gives correct and format); use such "
                "an environment or set grpo.adv_estimator.name=grpo"
            )
    if errors:
        raise ConfigError(errors)


def check_ray_resources(plan: RunPlan, cluster_cpus: float | None = None) -> None:
    """A one-line :class:`ConfigError` when the plan's actors cannot fit the Ray cluster's CPUs."""
    if cluster_cpus is None:
        cluster_cpus = ray_cluster_cpus()
    demand = ray_cpu_demand(plan)
    if demand > cluster_cpus:
        parts = " + ".join(f"{r.count} {r.name} × {r.cpus:g}" for r in plan.roles if r.cpus)
        dp = plan.role("policy").count
        raise ConfigError([
            f"policy.dp_size = {dp}: the Ray actors need {demand:g} CPUs ({parts}) but the Ray cluster "
            f"has {cluster_cpus:g}; lower policy.dp_size or policy.generation.num_generators, or give Ray more CPUs "
            "(cluster.num_cpus, cluster.address)"
        ])


def check_placement(plan: RunPlan, num_nodes: int, colocated: bool) -> None:
    """A one-line :class:`ConfigError` when the plan's bundles (and async GRPO's collector) cannot be placed on the
    connected cluster."""
    cluster_gpus = ray_cluster_gpus()
    trained = sum(plan.role(r).count for r in ("policy", "value") if plan.has(r))
    check_cluster_gpus(plan.numerics.device, trained, cluster_gpus)
    placement.check_bundles_fit(plan.placement, placement.cluster_nodes(), num_nodes,
                                "colocated" if colocated else "split")
    collector = plan.role("collector").gpus if plan.has("collector") else 0.0
    need = collector + sum(b.get("GPU", 0.0) for group in plan.placement.bundles.values() for b in group)
    if collector and need > cluster_gpus + 1e-9:
        raise ConfigError([
            f"grpo.async_grpo: the collector generates on a GPU of its own ({collector:g}) beside the placement "
            f"bundles' {need - collector:g}, {need:g} GPU(s) in all, but the Ray cluster has {cluster_gpus:g}; "
            "give Ray more GPUs (cluster.gpus_per_node, cluster.address), lower policy.dp_size, or set "
            "policy.device=cpu"
        ])


class Workers:
    """``policy``, ``rollout`` and, where the plan has them, ``value`` and ``teacher``, once :meth:`start` has run.

    ``env``: the ``env`` section (the generators' environments); ``shared_paths``: probes every worker checks first.
    """

    def __init__(self, plan: RunPlan, data_plane: DataPlaneClient, env: EnvConfig, *, shared_paths=None,
                 num_nodes: int = 1, watchdog: Watchdog | None = None):
        self.plan, self.data_plane, self.env, self.shared_paths = plan, data_plane, env, shared_paths
        self.num_nodes, self.watchdog = num_nodes, watchdog
        self.env_pools: dict[str, EnvPool] = {}
        self.policy = self.value = self.teacher = None
        self.rollout: Generators | None = None  # the generators, called like one rollout worker
        # Whether the generator samples from the policy's own module (hf, colocated): refit costs nothing.
        self.generator_shares_weights = False
        self.placement_groups: dict = {}  # under Ray: name -> placement group (runtime/placement.py)

    def start(self, init_state: dict | None, teacher_state: dict | None = None) -> None:
        """Build every worker; ``init_state`` / ``teacher_state`` are warm-up weights (None: the model's own)."""
        plan = self.plan
        n, runtime = plan.role("policy").count, plan.runtime

        def per_rank(options, state):
            return [dict(options=options, data_plane=self.data_plane, rank=r, world_size=n,
                         init_state=state, shared_paths=self.shared_paths) for r in range(n)]

        slots = {}
        if runtime != "local":
            self.placement_groups = placement.reserve(plan.placement, self.num_nodes)
            slots = {name: placement.scheduling(self.placement_groups, s) for name, s in plan.placement.slots.items()}

        def group(role: str, cls: type, options, state, distributed: bool = False):
            r = plan.role(role)
            return make_group(runtime, cls, per_rank(options, state), num_cpus=r.cpus, num_gpus=r.gpus,
                              distributed=distributed, scheduling=slots.get(role), data_plane=self.data_plane,
                              name=f"{'critic' if role == 'value' else role} rank", watchdog=self.watchdog)

        self.policy = group("policy", PolicyWorker, plan.policy, init_state, plan.distributed)
        if plan.value is not None:
            self.value = group("value", ValueWorker, plan.value, init_state, plan.distributed)
        if plan.teacher is not None:
            self.teacher = group("teacher", TeacherWorker, plan.teacher.options, teacher_state)
        self.env_pools = self._start_env_pools()
        self.rollout = self._start_generators(slots.get("generators"))
        try:  # awaited after the generators: a user task the rollout actor cannot import is said by it first
            await_env_pools(self.env_pools, self.env.start_timeout_s)
        except Exception as e:
            raise user_task_error_in(e, "an environment actor") or e from None

    def _start_env_pools(self) -> dict[str, EnvPool]:
        """Under Ray, the plan's environment pools (created, not awaited)."""
        if not self.plan.env_pools:
            return {}
        env = self.env
        return start_env_pools(self.plan.env_pools, env.env_kwargs, env_registry_snapshot(), env,
                               num_cpus=env.cpus_per_actor, env_vars=import_path_env())

    def _start_generators(self, scheduling: list | None) -> Generators:
        """The generators: one in-process samples from the policy's module, else each builds its own model,
        refit from the policy. Each has its own sampling seed."""
        plan, seed = self.plan, self.plan.seed
        if plan.runtime == "local" and plan.generators.count == 1:
            w = self.policy.workers[0]
            group = make_group("local", RolloutWorker, [dict(options=plan.rollout, env=EnvBlock(self.env),
                                                             data_plane=self.data_plane, model=w.model,
                                                             tokenizer=w.tokenizer, seed=seed)],
                               name="generator", watchdog=self.watchdog)
            self.generator_shares_weights = group.workers[0].backend.shares_weights
            return Generators(group)
        role = plan.role("generator")
        block = EnvBlock(self.env, self.env_pools)
        # The driver's working directory is importable there too (user tasks).
        try:
            group = make_group(plan.runtime, RolloutWorker,
                               [dict(options=plan.rollout, env=block, data_plane=self.data_plane, seed=seed + j,
                                     shared_paths=self.shared_paths) for j in range(role.count)],
                               num_cpus=role.cpus, num_gpus=role.gpus, scheduling=scheduling,
                               env_vars=import_path_env(), data_plane=self.data_plane, name="generator",
                               watchdog=self.watchdog)
        except Exception as e:  # a user task the actor's node cannot import: one line, not Ray's trace
            raise user_task_error_in(e) or e from None
        return Generators(group, sleeps=plan.generators.sleeps)

    def trained_groups(self) -> dict:
        """The groups whose weights a checkpoint holds, by sub-directory name."""
        groups = {"policy": self.policy, "value": self.value, "teacher": self.teacher}
        return {name: g for name, g in groups.items() if g is not None}

    def placement(self) -> dict:
        """Where each actor runs (``runtime: ray``): per trained group and the generators, the node, placement group
        and bundle each reports; ``environments``: each environment pool's actors, node and pid."""
        where = {name: g.run(g.cls.placement) for name, g in self.trained_groups().items()}
        where["generators"] = self.rollout.placement()
        if self.env_pools:
            where["environments"] = {name: pool.placement() for name, pool in self.env_pools.items()}
        return where

    def close(self) -> None:
        for g in (*self.trained_groups().values(), self.rollout):
            if g is not None:
                g.close()
        for pool in self.env_pools.values():
            pool.close()
        self.env_pools = {}
        if self.placement_groups:
            placement.release(self.placement_groups)
            self.placement_groups = {}
