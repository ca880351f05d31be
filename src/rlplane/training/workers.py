"""The session's workers: the policy (one per data-parallel rank), the rollout worker (the
generator and the environments), and, when the recipe asks for them, the critic and a frozen
teacher. All of them go through the runtime layer (:mod:`rlplane.runtime.groups`), so the same
code runs them in this process (``runtime: local``) or as Ray actors (``runtime: ray``).
"""

from __future__ import annotations

from rlplane.config.loading import ConfigError
from rlplane.config.schema import RunConfig
from rlplane.dataplane import DataPlaneClient
from rlplane.envs.user import import_path_env
from rlplane.runtime.devices import check_cluster_gpus, num_gpus_per_worker
from rlplane.runtime.groups import (
    cluster_cpus as ray_cluster_cpus,
    cluster_gpus as ray_cluster_gpus,
    make_actor,
    make_group,
)
from rlplane.workers.policy import PolicyWorker
from rlplane.workers.rollout import RolloutWorker
from rlplane.workers.teacher import TeacherWorker
from rlplane.workers.value import ValueWorker

# CPUs each Ray actor asks for (the workers below; async GRPO's collector).
RAY_CPUS_POLICY_RANK, RAY_CPUS_ROLLOUT, RAY_CPUS_CRITIC_RANK, RAY_CPUS_COLLECTOR = 0.5, 0.5, 0.25, 0.5
RAY_CPUS_TEACHER_RANK = 0.25


def ray_cpu_demand(cfg: RunConfig, uses_critic: bool, uses_teacher: bool = False) -> float:
    """CPUs the run's Ray actors ask for together; Ray never schedules an actor it cannot fit, so a
    demand above the cluster's CPUs would wait forever."""
    n = cfg.policy.dp_size
    demand = n * RAY_CPUS_POLICY_RANK + RAY_CPUS_ROLLOUT
    if uses_critic:
        demand += n * RAY_CPUS_CRITIC_RANK
    if uses_teacher:
        demand += n * RAY_CPUS_TEACHER_RANK
    if cfg.algorithm == "grpo" and cfg.grpo.async_grpo.enabled:
        demand += RAY_CPUS_COLLECTOR
    return demand


def check_ray_resources(cfg: RunConfig, uses_critic: bool, cluster_cpus: float | None = None,
                        uses_teacher: bool = False) -> None:
    """A one-line :class:`ConfigError` when the actors cannot all fit the Ray cluster's CPUs
    (``cluster_cpus``, default: the connected cluster's)."""
    if cluster_cpus is None:
        cluster_cpus = ray_cluster_cpus()
    demand = ray_cpu_demand(cfg, uses_critic, uses_teacher)
    if demand > cluster_cpus:
        parts = f"{RAY_CPUS_POLICY_RANK:g} per policy rank + {RAY_CPUS_ROLLOUT:g} rollout"
        parts += f" + {RAY_CPUS_CRITIC_RANK:g} per critic rank" if uses_critic else ""
        parts += f" + {RAY_CPUS_TEACHER_RANK:g} per teacher rank" if uses_teacher else ""
        parts += (f" + {RAY_CPUS_COLLECTOR:g} collector"
                  if cfg.algorithm == "grpo" and cfg.grpo.async_grpo.enabled else "")
        raise ConfigError([
            f"policy.dp_size = {cfg.policy.dp_size}: the Ray actors need {demand:g} CPUs ({parts}) but the Ray cluster "
            f"has {cluster_cpus:g}; lower policy.dp_size, or give Ray more CPUs (cluster.num_cpus, cluster.address)"
        ])


class Workers:
    """``policy``, ``rollout`` and the optional ``value`` / ``teacher`` once :meth:`start` has run.

    ``critic``: build the value workers (PPO with GAE). ``teacher_cfg``: the teacher's run config
    (its ``policy`` section names the teacher's model) for a frozen :class:`TeacherWorker` group.
    ``shared_paths``: the probes every worker checks first (:mod:`rlplane.runtime.shared_paths`).
    """

    def __init__(self, cfg: RunConfig, data_plane: DataPlaneClient, *, critic: bool = False,
                 teacher_cfg: RunConfig | None = None, shared_paths=None):
        self.cfg, self.data_plane, self.shared_paths = cfg, data_plane, shared_paths
        self.critic, self.teacher_cfg = critic, teacher_cfg
        self.policy = self.rollout = self.value = self.teacher = None
        # Whether the generator samples from the policy's own module (hf, colocated): then a refit costs nothing.
        self.generator_shares_weights = False

    @property
    def needs_reference(self) -> bool:
        return (self.cfg.loss_fn.reference_policy_kl_penalty != 0
                and not self.cfg.loop.skip_reference_policy_logprobs_calculation)

    def start(self, init_state: dict | None, teacher_state: dict | None = None) -> None:
        """Build every worker; ``init_state`` / ``teacher_state`` are warm-up weights (None: the model's own)."""
        cfg = self.cfg
        n, runtime = cfg.policy.dp_size, cfg.runtime

        def per_rank(run_cfg, state):
            return [dict(cfg=run_cfg, data_plane=self.data_plane, rank=r, world_size=n,
                         init_state=state, shared_paths=self.shared_paths) for r in range(n)]

        gpus = 0.0
        if runtime != "local":
            cluster_gpus = ray_cluster_gpus()
            check_cluster_gpus(cfg.policy.device, n * (1 + self.critic), cluster_gpus)
            gpus = num_gpus_per_worker(cfg.policy.device, cluster_gpus)
        # Ranks join one process group when there are several, or when FSDP shards even one rank's model.
        distributed = n > 1 or cfg.policy.dtensor_cfg.enabled
        self.policy = make_group(runtime, PolicyWorker, per_rank(cfg, init_state), num_cpus=RAY_CPUS_POLICY_RANK,
                                 num_gpus=gpus, distributed=distributed)
        if runtime == "local":
            # Colocated: the generator shares the policy's module (hf samples from it directly).
            w = self.policy.workers[0]
            self.rollout = make_actor(runtime, RolloutWorker, dict(cfg=cfg, data_plane=self.data_plane, model=w.model,
                                                                   tokenizer=w.tokenizer, seed=cfg.loop.seed))
            self.generator_shares_weights = self.rollout.obj.backend.shares_weights
        if self.critic:
            # A quarter CPU each: policy (0.5/rank) + rollout (0.5) + critic still fit Ray's 2 CPUs at dp_size 2.
            self.value = make_group(runtime, ValueWorker, per_rank(cfg, init_state), num_cpus=RAY_CPUS_CRITIC_RANK,
                                    num_gpus=gpus, distributed=distributed)
        if runtime != "local":
            # Its own weights, built from the config: the refit part pushes the policy's into it at start.
            # The driver's working directory is importable there too (user tasks by import path).
            self.rollout = make_actor(runtime, RolloutWorker, dict(cfg=cfg, data_plane=self.data_plane,
                                                                   seed=cfg.loop.seed, shared_paths=self.shared_paths),
                                      num_cpus=RAY_CPUS_ROLLOUT,
                                      env_vars=import_path_env())
        if self.teacher_cfg is not None:
            self.teacher = make_group(runtime, TeacherWorker, per_rank(self.teacher_cfg, teacher_state),
                                      num_cpus=RAY_CPUS_TEACHER_RANK)

    def trained_groups(self) -> dict:
        """The groups whose weights a checkpoint holds, by sub-directory name."""
        groups = {"policy": self.policy, "value": self.value, "teacher": self.teacher}
        return {name: g for name, g in groups.items() if g is not None}

    def close(self) -> None:
        for g in (*self.trained_groups().values(), self.rollout):
            if g is not None:
                g.close()
