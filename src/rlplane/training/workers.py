"""The session's workers: the policy (one per data-parallel rank), the rollout worker (the
generator and the environments), and, when the recipe asks for them, the critic and a frozen
teacher. All of them go through the runtime layer (:mod:`rlplane.runtime.groups`), so the same
code runs them in this process (``runtime: local``) or as Ray actors (``runtime: ray``).
"""

from __future__ import annotations

from rlplane.config.schema import RunConfig
from rlplane.dataplane import DataPlaneClient
from rlplane.envs.user import import_path_env
from rlplane.runtime.groups import make_actor, make_group
from rlplane.workers.policy import PolicyWorker
from rlplane.workers.rollout import RolloutWorker
from rlplane.workers.teacher import TeacherWorker
from rlplane.workers.value import ValueWorker


class Workers:
    """``policy``, ``rollout`` and the optional ``value`` / ``teacher`` once :meth:`start` has run.

    ``critic``: build the value workers (PPO with GAE). ``teacher_cfg``: the teacher's run config
    (its ``policy`` section names the teacher's model) for a frozen :class:`TeacherWorker` group.
    """

    def __init__(self, cfg: RunConfig, data_plane: DataPlaneClient, *, critic: bool = False,
                 teacher_cfg: RunConfig | None = None):
        self.cfg, self.data_plane = cfg, data_plane
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
            return [dict(cfg=run_cfg, data_plane=self.data_plane, rank=r, world_size=n, init_state=state) for r in range(n)]

        self.policy = make_group(runtime, PolicyWorker, per_rank(cfg, init_state), num_cpus=0.5, distributed=True)
        if runtime == "local":
            # Colocated: the generator shares the policy's module (hf samples from it directly).
            w = self.policy.workers[0]
            self.rollout = make_actor(runtime, RolloutWorker, dict(cfg=cfg, data_plane=self.data_plane, model=w.model,
                                                                   tokenizer=w.tokenizer, seed=cfg.loop.seed))
            self.generator_shares_weights = self.rollout.obj.backend.shares_weights
        if self.critic:
            # A quarter CPU each: policy (0.5/rank) + rollout (0.5) + critic still fit Ray's 2 CPUs at dp_size 2.
            self.value = make_group(runtime, ValueWorker, per_rank(cfg, init_state), num_cpus=0.25, distributed=True)
        if runtime != "local":
            # Its own weights, built from the config: the refit part pushes the policy's into it at start.
            # The driver's working directory is importable there too (user tasks by import path).
            self.rollout = make_actor(runtime, RolloutWorker, dict(cfg=cfg, data_plane=self.data_plane,
                                                                   seed=cfg.loop.seed), num_cpus=0.5,
                                      env_vars=import_path_env())
        if self.teacher_cfg is not None:
            self.teacher = make_group(runtime, TeacherWorker, per_rank(self.teacher_cfg, teacher_state), num_cpus=0.25)

    def trained_groups(self) -> dict:
        """The groups whose weights a checkpoint holds, by sub-directory name."""
        groups = {"policy": self.policy, "value": self.value, "teacher": self.teacher}
        return {name: g for name, g in groups.items() if g is not None}

    def close(self) -> None:
        for g in (*self.trained_groups().values(), self.rollout):
            if g is not None:
                g.close()
