"""The session's workers: the policy ranks, the generators, the environment actor pools (``runtime: ray``),
and on request the critic and a frozen teacher, all through :mod:`rlplane.runtime.groups` (in-process or Ray
actors in placement groups; environment actors: :mod:`rlplane.runtime.env_pools`)."""

from __future__ import annotations

from rlplane.config.schema import RunConfig
from rlplane.dataplane import DataPlaneClient
from rlplane.envs.registry import env_registry_snapshot, reward_component_names, sendable_env_names
from rlplane.envs.user import import_path_env, user_task_error_in
from rlplane.errors import ConfigError
from rlplane.runtime import placement
from rlplane.runtime.devices import check_cluster_gpus, gpu_requests, num_gpus_per_worker
from rlplane.runtime.env_pools import EnvPool, await_env_pools, pool_env_names, start_env_pools
from rlplane.runtime.groups import (
    cluster_cpus as ray_cluster_cpus,
    cluster_gpus as ray_cluster_gpus,
    make_group,
)
from rlplane.training.generators import Generators
from rlplane.workers.policy import PolicyWorker, PolicyWorkerOptions
from rlplane.workers.rollout import RolloutWorker
from rlplane.workers.teacher import TeacherWorker, TeacherWorkerOptions
from rlplane.workers.value import ValueWorker, ValueWorkerOptions

# CPUs each Ray actor asks for (the workers below; async GRPO's collector).
RAY_CPUS_POLICY_RANK, RAY_CPUS_ROLLOUT, RAY_CPUS_CRITIC_RANK, RAY_CPUS_COLLECTOR = 0.5, 0.5, 0.25, 0.5
RAY_CPUS_TEACHER_RANK = 0.25


def needs_reference(cfg: RunConfig) -> bool:
    """Whether the policy keeps a frozen reference: the loss's KL term (β ≠ 0) with its logprobs computed."""
    return cfg.loss_fn.reference_policy_kl_penalty != 0 and not cfg.loop.skip_reference_policy_logprobs_calculation


def policy_options(cfg: RunConfig) -> PolicyWorkerOptions:
    return PolicyWorkerOptions(policy=cfg.policy, seed=cfg.loop.seed, reference=needs_reference(cfg))


def value_options(cfg: RunConfig) -> ValueWorkerOptions:
    return ValueWorkerOptions(policy=cfg.policy, value=cfg.value, seed=cfg.loop.seed)


def teacher_options(teacher_cfg: RunConfig) -> TeacherWorkerOptions:
    """``teacher_cfg``: the run's config with ``policy`` naming the teacher (``distillation.teacher_config``)."""
    return TeacherWorkerOptions(policy=teacher_cfg.policy, seed=teacher_cfg.loop.seed)


def env_pool_specs(cfg: RunConfig, task_names) -> dict[str, tuple[str, int]]:
    """Pool name -> (environment, actors) for ``task_names`` and ``env.val_task_to_env`` under ``runtime: ray``.
    An environment whose factory cannot be sent to another process gets no pool (it runs in the rollout worker)."""
    if cfg.runtime == "local":
        return {}
    sendable = sendable_env_names()
    specs = {name: (env, cfg.env.pool_size(env))
             for name, env in pool_env_names(task_names, cfg.env.val_task_to_env).items()}
    return {name: (env, n) for name, (env, n) in specs.items() if env in sendable and n > 0}


def ray_cpu_demand(cfg: RunConfig, uses_critic: bool, uses_teacher: bool = False, env_actors: int = 0) -> float:
    """CPUs the run's Ray actors ask for together (Ray never schedules an actor it cannot fit)."""
    n = cfg.policy.dp_size
    demand = n * RAY_CPUS_POLICY_RANK + cfg.policy.generation.num_generators * RAY_CPUS_ROLLOUT
    demand += env_actors * cfg.env.cpus_per_actor
    if uses_critic:
        demand += n * RAY_CPUS_CRITIC_RANK
    if uses_teacher:
        demand += n * RAY_CPUS_TEACHER_RANK
    if cfg.algorithm == "grpo" and cfg.grpo.async_grpo.enabled:
        demand += RAY_CPUS_COLLECTOR
    return demand


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


def check_ray_resources(cfg: RunConfig, uses_critic: bool, cluster_cpus: float | None = None,
                        uses_teacher: bool = False, env_actors: int = 0) -> None:
    """A one-line :class:`ConfigError` when the actors cannot fit the Ray cluster's CPUs."""
    if cluster_cpus is None:
        cluster_cpus = ray_cluster_cpus()
    demand = ray_cpu_demand(cfg, uses_critic, uses_teacher, env_actors)
    if demand > cluster_cpus:
        parts = f"{RAY_CPUS_POLICY_RANK:g} per policy rank + {RAY_CPUS_ROLLOUT:g} per generator"
        parts += (f" + {cfg.env.cpus_per_actor:g} per environment actor ({env_actors})"
                  if env_actors and cfg.env.cpus_per_actor else "")
        parts += f" + {RAY_CPUS_CRITIC_RANK:g} per critic rank" if uses_critic else ""
        parts += f" + {RAY_CPUS_TEACHER_RANK:g} per teacher rank" if uses_teacher else ""
        parts += (f" + {RAY_CPUS_COLLECTOR:g} collector"
                  if cfg.algorithm == "grpo" and cfg.grpo.async_grpo.enabled else "")
        raise ConfigError([
            f"policy.dp_size = {cfg.policy.dp_size}: the Ray actors need {demand:g} CPUs ({parts}) but the Ray cluster "
            f"has {cluster_cpus:g}; lower policy.dp_size or policy.generation.num_generators, or give Ray more CPUs "
            "(cluster.num_cpus, cluster.address)"
        ])


def _engine_gpus(cfg: RunConfig) -> int:
    """GPUs one generator's engine spans: a vLLM engine's tensor-parallel size, else one."""
    gen = cfg.policy.generation
    return gen.vllm_cfg.tensor_parallel_size if gen.backend == "vllm" else 1


def ray_gpus(cfg: RunConfig, gpus_per_rank: float, uses_teacher: bool = False) -> dict[str, float]:
    """GPUs each Ray actor asks for (policy, value, teacher, generator: :func:`gpu_requests`) when a trainable
    rank gets ``gpus_per_rank``: generators and a teacher compute where the policy does."""
    return gpu_requests(gpus_per_rank, cfg.policy.generation.colocated.enabled, uses_teacher, _engine_gpus(cfg))


def placement_plan(cfg: RunConfig, uses_critic: bool, uses_teacher: bool, gpus_per_rank: float
                   ) -> placement.PlacementPlan:
    """The run's placement groups, colocated or split as ``policy.generation.colocated.enabled`` says."""
    rank_cpus, rank_gpus = {"policy": RAY_CPUS_POLICY_RANK}, {"policy": gpus_per_rank}
    if uses_critic:  # a critic rank computes on the policy's device: a GPU of its own
        rank_cpus["value"], rank_gpus["value"] = RAY_CPUS_CRITIC_RANK, gpus_per_rank
    if uses_teacher:
        rank_cpus["teacher"] = RAY_CPUS_TEACHER_RANK
    gen = cfg.policy.generation
    return placement.plan_placement(dp_size=cfg.policy.dp_size, num_generators=gen.num_generators,
                                    colocated=gen.colocated.enabled, rank_cpus=rank_cpus,
                                    generator_cpus=RAY_CPUS_ROLLOUT, rank_gpus=rank_gpus,
                                    generator_gpus=ray_gpus(cfg, gpus_per_rank, uses_teacher)["generator"],
                                    num_nodes=cfg.cluster.num_nodes)


def collector_gpus(cfg: RunConfig, cluster_gpus: float) -> float:
    """GPUs async GRPO's collector asks for under Ray: a split generator's (it generates while the policy trains)."""
    if cfg.algorithm != "grpo" or not cfg.grpo.async_grpo.enabled:
        return 0.0
    gpus = num_gpus_per_worker(cfg.policy.device, cluster_gpus)
    return gpu_requests(gpus, colocated=False, tensor_parallel=_engine_gpus(cfg))["generator"]


def check_placement(cfg: RunConfig, uses_critic: bool, uses_teacher: bool = False) -> None:
    """A one-line :class:`ConfigError` when the run's bundles (and async GRPO's collector) cannot be placed on the
    connected cluster."""
    cluster_gpus = ray_cluster_gpus()
    gpus = num_gpus_per_worker(cfg.policy.device, cluster_gpus)
    mode = "colocated" if cfg.policy.generation.colocated.enabled else "split"
    plan = placement_plan(cfg, uses_critic, uses_teacher, gpus)
    placement.check_bundles_fit(plan, placement.cluster_nodes(), cfg.cluster.num_nodes, mode)
    collector = collector_gpus(cfg, cluster_gpus)
    need = collector + sum(b.get("GPU", 0.0) for group in plan.bundles.values() for b in group)
    if collector and need > cluster_gpus + 1e-9:
        raise ConfigError([
            f"grpo.async_grpo: the collector generates on a GPU of its own ({collector:g}) beside the placement "
            f"bundles' {need - collector:g}, {need:g} GPU(s) in all, but the Ray cluster has {cluster_gpus:g}; "
            "give Ray more GPUs (cluster.gpus_per_node, cluster.address), lower policy.dp_size, or set "
            "policy.device=cpu"
        ])


class Workers:
    """``policy``, ``rollout`` and the optional ``value`` / ``teacher`` once :meth:`start` has run.

    ``teacher_cfg``: the teacher's run config; ``shared_paths``: probes every worker checks first.
    """

    def __init__(self, cfg: RunConfig, data_plane: DataPlaneClient, *, critic: bool = False,
                 teacher_cfg: RunConfig | None = None, shared_paths=None,
                 env_pool_specs: dict[str, tuple[str, int]] | None = None):
        self.cfg, self.data_plane, self.shared_paths = cfg, data_plane, shared_paths
        self.critic, self.teacher_cfg = critic, teacher_cfg
        self.env_pool_specs = dict(env_pool_specs or {})  # pool name -> (environment, actors); runtime: ray
        self.env_pools: dict[str, EnvPool] = {}
        self.policy = self.value = self.teacher = None
        self.rollout: Generators | None = None  # the generators, called like one rollout worker
        # Whether the generator samples from the policy's own module (hf, colocated): refit costs nothing.
        self.generator_shares_weights = False
        self.placement_groups: dict = {}  # under Ray: name -> placement group (runtime/placement.py)

    @property
    def needs_reference(self) -> bool:
        return needs_reference(self.cfg)

    def start(self, init_state: dict | None, teacher_state: dict | None = None) -> None:
        """Build every worker; ``init_state`` / ``teacher_state`` are warm-up weights (None: the model's own)."""
        cfg = self.cfg
        n, runtime = cfg.policy.dp_size, cfg.runtime

        def per_rank(options, state):
            return [dict(options=options, data_plane=self.data_plane, rank=r, world_size=n,
                         init_state=state, shared_paths=self.shared_paths) for r in range(n)]

        gpus, slots = 0.0, {}
        requests = gpu_requests(0.0, False)
        if runtime != "local":
            cluster_gpus = ray_cluster_gpus()
            check_cluster_gpus(cfg.policy.device, n * (1 + self.critic), cluster_gpus)
            gpus = num_gpus_per_worker(cfg.policy.device, cluster_gpus)
            requests = ray_gpus(cfg, gpus, self.teacher_cfg is not None)
            plan = placement_plan(cfg, self.critic, self.teacher_cfg is not None, gpus)
            self.placement_groups = placement.reserve(plan, cfg.cluster.num_nodes)
            slots = {name: placement.scheduling(self.placement_groups, s) for name, s in plan.slots.items()}
        # One process group when several ranks, or when FSDP shards one rank.
        distributed = n > 1 or cfg.policy.dtensor_cfg.enabled
        self.policy = make_group(runtime, PolicyWorker, per_rank(policy_options(cfg), init_state),
                                 num_cpus=RAY_CPUS_POLICY_RANK, num_gpus=requests["policy"], distributed=distributed,
                                 scheduling=slots.get("policy"), data_plane=self.data_plane, name="policy rank")
        if self.critic:
            # A quarter CPU each, so policy + rollout + critic fit Ray's 2 CPUs at dp_size 2.
            self.value = make_group(runtime, ValueWorker, per_rank(value_options(cfg), init_state),
                                    num_cpus=RAY_CPUS_CRITIC_RANK, num_gpus=requests["value"], distributed=distributed,
                                    scheduling=slots.get("value"), data_plane=self.data_plane, name="critic rank")
        if self.teacher_cfg is not None:
            self.teacher = make_group(runtime, TeacherWorker,
                                      per_rank(teacher_options(self.teacher_cfg), teacher_state),
                                      num_cpus=RAY_CPUS_TEACHER_RANK, num_gpus=requests["teacher"],
                                      scheduling=slots.get("teacher"),
                                      data_plane=self.data_plane, name="teacher rank")
        self.env_pools = self._start_env_pools()
        self.rollout = self._start_generators(slots.get("generators"), requests["generator"])
        try:  # awaited after the generators: a user task the rollout actor cannot import is said by it first
            await_env_pools(self.env_pools, cfg.env.start_timeout_s)
        except Exception as e:
            raise user_task_error_in(e, "an environment actor") or e from None

    def _start_env_pools(self) -> dict[str, EnvPool]:
        """Under Ray, the pools of ``env_pool_specs`` (created, not awaited)."""
        if not self.env_pool_specs:
            return {}
        env = self.cfg.env
        return start_env_pools(self.env_pool_specs, env.env_kwargs, env_registry_snapshot(), env,
                               num_cpus=env.cpus_per_actor, env_vars=import_path_env())

    def _start_generators(self, scheduling: list | None, num_gpus: float) -> Generators:
        """The generators: one in-process samples from the policy's module, else each builds its own model,
        refit from the policy. Each has its own sampling seed."""
        cfg, gen = self.cfg, self.cfg.policy.generation
        if cfg.runtime == "local" and gen.num_generators == 1:
            w = self.policy.workers[0]
            group = make_group("local", RolloutWorker, [dict(cfg=cfg, data_plane=self.data_plane, model=w.model,
                                                             tokenizer=w.tokenizer, seed=cfg.loop.seed)],
                               name="generator")
            self.generator_shares_weights = group.workers[0].backend.shares_weights
            return Generators(group)
        # The driver's working directory is importable there too (user tasks).
        try:
            group = make_group(cfg.runtime, RolloutWorker,
                               [dict(cfg=cfg, data_plane=self.data_plane, seed=cfg.loop.seed + j,
                                     shared_paths=self.shared_paths, env_pools=self.env_pools)
                                for j in range(gen.num_generators)],
                               num_cpus=RAY_CPUS_ROLLOUT, num_gpus=num_gpus, scheduling=scheduling,
                               env_vars=import_path_env(),
                               data_plane=self.data_plane, name="generator")
        except Exception as e:  # a user task the actor's node cannot import: one line, not Ray's trace
            raise user_task_error_in(e) or e from None
        # Colocated under Ray they sleep while the policy trains; vLLM sleep mode frees GPU memory anywhere.
        sleeps = (cfg.runtime != "local" and gen.colocated.enabled) or (
            gen.backend == "vllm" and gen.vllm_cfg.enable_sleep_mode)
        return Generators(group, sleeps=sleeps)

    def trained_groups(self) -> dict:
        """The groups whose weights a checkpoint holds, by sub-directory name."""
        groups = {"policy": self.policy, "value": self.value, "teacher": self.teacher}
        return {name: g for name, g in groups.items() if g is not None}

    def env_placement(self) -> dict[str, list[dict]]:
        """Pool name -> where each of its environment actors runs (node, pid)."""
        return {name: pool.placement() for name, pool in self.env_pools.items()}

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
