"""The run plan: what a run is, settled once from its config (and the data and cluster it finds), then frozen.

Its roles (policy, generators, value, teacher, async collector, environment pools) and where each runs, every
derived size, device and numerics, the data plane and where its key index lives, and the recipe loop's
end-of-step jobs. The session builds it first, prints it as a short table, writes it beside ``config.yaml``
(``plan.yaml``) and hands each part its slice: the options each worker is built with come from here, so no part
derives a size or a role again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from rlplane.config.recipes import recipe_for
from rlplane.config.schema import RunConfig, WarmupConfig
from rlplane.envs.registry import sendable_env_names
from rlplane.runtime import placement as placements
from rlplane.runtime.devices import gpu_requests, num_gpus_per_worker
from rlplane.runtime.env_pools import pool_env_names
from rlplane.runtime.shared_paths import with_driver_model_path
from rlplane.training.numerics import Numerics, numerics, settle_precision
from rlplane.training.weight_check import WeightCheckOptions
from rlplane.workers.policy import PolicyWorkerOptions
from rlplane.workers.rollout import RolloutOptions
from rlplane.workers.teacher import TeacherWorkerOptions
from rlplane.workers.value import ValueWorkerOptions

# CPUs each Ray actor asks for: a quarter for a critic or teacher rank, so policy + generator + critic fit Ray's
# 2 CPUs at dp_size 2.
RAY_CPUS = {"policy": 0.5, "generator": 0.5, "value": 0.25, "teacher": 0.25, "collector": 0.5}
# The jobs that end every step, in the order the recipe loop runs them (Session: trained, validate_if_due,
# log_step, checkpoint_if_due, stop_requested).
END_OF_STEP = ("refit", "validate", "log", "checkpoint")


@dataclass(frozen=True)
class Role:
    """``count`` workers of one kind (ranks, generators, actors), each running ``where`` and asking Ray for ``cpus``
    and ``gpus`` (``runtime: ray``); ``model``: what it computes with."""

    name: str
    count: int
    where: str
    model: str
    cpus: float = 0.0
    gpus: float = 0.0


@dataclass(frozen=True)
class Sizes:
    """Every size a step derives from the config, computed here once."""

    prompts_per_step: int
    generations_per_prompt: int
    samples_per_step: int  # prompts × generations: the rows of a step's partition
    train_global_batch_size: int
    optimizer_steps_per_step: int  # of the policy, over all its passes (PPO: × ppo_epochs)
    train_micro_batch_size: int
    logprob_batch_size: int
    steps_per_epoch: int | None  # the loader's batches per pass over the training prompts (None: not known)
    last_step: int  # max_num_steps, or sooner when max_num_epochs run out (dynamic sampling: max_num_steps)


@dataclass(frozen=True)
class DataPlanePlan:
    """The data plane's ``backend`` and where its key ``index`` lives (``why``: the reason for ``auto``'s choice)."""

    backend: str
    index: str
    why: str


@dataclass(frozen=True)
class StepJob:
    """One job that ends every step (:data:`END_OF_STEP`), and when it does something."""

    name: str
    when: str


@dataclass(frozen=True)
class TeacherPlan:
    """The frozen teacher of distillation: its ranks' options and its own warm-up."""

    options: TeacherWorkerOptions
    warmup: WarmupConfig


@dataclass(frozen=True)
class GeneratorPlan:
    """``shares_policy_module``: one in-process generator sampling from the policy's own module (no refit copy);
    ``sleeps``: the generators release their weights while the policy trains (colocated under Ray, vLLM sleep)."""

    count: int
    shares_policy_module: bool
    sleeps: bool


@dataclass(frozen=True)
class RunPlan:
    recipe: str  # grpo | async_grpo | ppo | distillation
    runtime: str
    seed: int
    roles: tuple[Role, ...]
    sizes: Sizes
    numerics: Numerics
    data_plane: DataPlanePlan
    end_of_step: tuple[StepJob, ...]
    # What each worker is built with.
    policy: PolicyWorkerOptions
    value: ValueWorkerOptions | None
    teacher: TeacherPlan | None
    rollout: RolloutOptions
    generators: GeneratorPlan
    weight_check: WeightCheckOptions
    env_pools: dict[str, tuple[str, int]]  # pool name -> (environment, actors); runtime: ray
    placement: placements.PlacementPlan | None  # runtime: ray
    # How the policy's ranks compute together: one process group (several ranks, or FSDP on one) and a
    # weight gather every rank joins (FSDP over several ranks).
    distributed: bool
    sharded_policy: bool
    skips_prev_logprob_forward: bool  # a step runs no prev-logprob forward (the driver and the workers agree)

    def has(self, role: str) -> bool:
        return any(r.name == role for r in self.roles)

    def role(self, name: str) -> Role:
        return next(r for r in self.roles if r.name == name)

    @property
    def needs_reference(self) -> bool:
        """Whether the policy keeps a frozen reference (the loss's KL term reads its logprobs)."""
        return self.policy.reference

    def table(self, where: Path | None = None) -> str:
        """The plan as a short table (printed at start-up)."""
        s, n = self.sizes, self.numerics
        rows = [("recipe", f"{self.recipe}, runtime {self.runtime}, seed {self.seed}")]
        for r in self.roles:
            asks = [f"{r.cpus:g} CPU"] * bool(r.cpus) + [f"{r.gpus:g} GPU"] * bool(r.gpus)  # Ray's, per actor
            each = f" ({', '.join(asks)} each)" if asks else ""
            rows.append((r.name, f"{r.count} × {r.model}, {r.where}{each}"))
        rows.append(("numerics", f"{n.precision} on {n.device} ({n.why})"))
        epoch = f"{s.steps_per_epoch} steps per epoch, " if s.steps_per_epoch else ""
        rows.append(("step", f"{s.prompts_per_step} prompts × {s.generations_per_prompt} generations = "
                             f"{s.samples_per_step} samples; {s.optimizer_steps_per_step} optimizer step(s) of "
                             f"{s.train_global_batch_size} in micro-batches of {s.train_micro_batch_size}; "
                             f"logprobs in batches of {s.logprob_batch_size}"))
        rows.append(("steps", f"{epoch}last step {s.last_step}"))
        d = self.data_plane
        rows.append(("data plane", f"{d.backend}, index {d.index} ({d.why})"))
        rows.append(("end of step", " · ".join(f"{j.name} {j.when}" for j in self.end_of_step)))
        width = max(len(k) for k, _ in rows)
        head = "run plan" + (f" ({where})" if where is not None else "")
        return "\n".join([head, *(f"  {k.ljust(width)}  {v}" for k, v in rows)])

    def to_dict(self) -> dict:
        """Plain data for ``plan.yaml``: roles, sizes, numerics, data plane, end-of-step jobs."""
        return {
            "recipe": self.recipe, "runtime": self.runtime, "seed": self.seed,
            "roles": {r.name: {k: v for k, v in dataclasses.asdict(r).items() if k != "name"} for r in self.roles},
            "sizes": dataclasses.asdict(self.sizes),
            "numerics": dataclasses.asdict(self.numerics),
            "data_plane": dataclasses.asdict(self.data_plane),
            "end_of_step": {j.name: j.when for j in self.end_of_step},
            "weight_check": dataclasses.asdict(self.weight_check),
        }


# ---- the pieces, each a function of the config (tests build them alone)

def needs_reference(cfg: RunConfig) -> bool:
    """Whether the policy keeps a frozen reference: the loss's KL term (β ≠ 0) with its logprobs computed."""
    return cfg.loss_fn.reference_policy_kl_penalty != 0 and not cfg.loop.skip_reference_policy_logprobs_calculation


def weight_check_options(cfg: RunConfig) -> WeightCheckOptions:
    """``policy.generation.verify_weights`` and its probe cadence, read here only."""
    g = cfg.policy.generation
    return WeightCheckOptions(g.verify_weights, g.verify_probe_every)


def policy_options(cfg: RunConfig) -> PolicyWorkerOptions:
    return PolicyWorkerOptions(policy=cfg.policy, seed=cfg.loop.seed, reference=needs_reference(cfg),
                               fingerprint_sent=weight_check_options(cfg).enabled)


def value_options(cfg: RunConfig) -> ValueWorkerOptions:
    return ValueWorkerOptions(policy=cfg.policy, value=cfg.value, seed=cfg.loop.seed)


def teacher_plan(cfg: RunConfig) -> TeacherPlan:
    """The distillation teacher: the run's ``policy`` section with ``teacher.*`` as its model, its own warm-up."""
    t = cfg.teacher
    policy = cfg.policy.model_copy(update={"model_name": t.model_name, "tiny": t.tiny})
    return TeacherPlan(TeacherWorkerOptions(policy=policy, seed=cfg.loop.seed), t.warmup)


def rollout_options(cfg: RunConfig) -> RolloutOptions:
    g = cfg.loop
    return RolloutOptions(policy=cfg.policy, seed=g.seed, max_rollout_turns=g.max_rollout_turns,
                          env_retries=g.rollout_max_retries if g.rollout_failure_policy == "retry" else 0)


def uses_critic(cfg: RunConfig) -> bool:
    """PPO with GAE trains a value model (raw-reward PPO needs none)."""
    return cfg.algorithm == "ppo" and cfg.ppo.adv_estimator.name == "gae"


def is_async(cfg: RunConfig) -> bool:
    return cfg.algorithm == "grpo" and cfg.grpo.async_grpo.enabled


def prev_logprobs_are_the_training_forward(cfg: RunConfig) -> bool:
    """Whether a step's old-policy logprobs equal its training forward's, detached (prev forward redundant).

    True when the first global batch's training forward runs at π_old's weights and nothing reads prev
    before training: one global batch per rollout (prompts × generations == ``train_global_batch_size``),
    ``ppo_epochs == 1``, no ``seq_logprob_error_threshold``, no KL in the reward, no LoRA dropout (prev runs
    in eval mode). Async GRPO qualifies (it recomputes prev with current weights); the mismatch metrics then
    come from the training forward. TRL and NeMo RL's on-policy shortcut do the same.
    """
    g, p, lf = cfg.loop, cfg.policy, cfg.loss_fn
    one_global_batch = g.samples_per_step() == p.train_global_batch_size
    one_pass = cfg.algorithm != "ppo" or cfg.ppo.ppo_epochs == 1
    read_before_training = g.seq_logprob_error_threshold is not None or (
        lf.use_kl_in_reward and lf.reference_policy_kl_penalty != 0
    )
    dropout = p.lora.enabled and p.lora.dropout > 0
    return one_global_batch and one_pass and not read_before_training and not dropout


def skips_prev_logprob_forward(cfg: RunConfig) -> bool:
    """Whether a step runs no prev-logprob forward (``force_on_policy_ratio``, or the above)."""
    return cfg.loss_fn.force_on_policy_ratio or prev_logprobs_are_the_training_forward(cfg)


def data_plane_index(cfg: RunConfig) -> tuple[str, str]:
    """``(index, why)``: where the ray data plane keeps its key index, ``"driver"`` or ``"store"``.

    ``auto``: ``driver`` (no store round trips) when the plane is ``ray`` and the recipe's driver owns every
    key (:attr:`Recipe.driver_owns_keys`), else ``store`` (async GRPO's collector; unused by ``memory``).
    """
    index = cfg.data_plane.index
    if index != "auto":
        return index, "set in the config"
    if cfg.data_plane.backend != "ray":
        return "store", f"data_plane.backend = {cfg.data_plane.backend}: its index is in-process, the choice is unused"
    recipe = recipe_for(cfg)
    name = recipe.train.partition(":")[0].rpartition(".")[2]  # the recipe's module: grpo, async_grpo, ...
    if recipe.driver_owns_keys:
        return "driver", f"recipe {name}: the driver owns every key, its workers read the metas it sends"
    return "store", f"recipe {name}: a process other than the driver reads and clears keys"


def env_pool_specs(cfg: RunConfig, task_names) -> dict[str, tuple[str, int]]:
    """Pool name -> (environment, actors) for ``task_names`` and ``env.val_task_to_env`` under ``runtime: ray``.
    An environment whose factory cannot be sent to another process gets no pool (it runs in the rollout worker)."""
    if cfg.runtime == "local":
        return {}
    sendable = sendable_env_names()
    specs = {name: (env, cfg.env.pool_size(env))
             for name, env in pool_env_names(task_names, cfg.env.val_task_to_env).items()}
    return {name: (env, n) for name, (env, n) in specs.items() if env in sendable and n > 0}


def _sizes(cfg: RunConfig, steps_per_epoch: int | None) -> Sizes:
    g, p = cfg.loop, cfg.policy
    samples = g.samples_per_step()
    passes = cfg.ppo.ppo_epochs if cfg.algorithm == "ppo" else 1
    last = g.max_num_steps
    if steps_per_epoch is not None and not g.use_dynamic_sampling:
        last = min(last, g.max_num_epochs * steps_per_epoch)  # NeMo RL's min
    return Sizes(g.num_prompts_per_step, g.num_generations_per_prompt, samples, p.train_global_batch_size,
                 passes * max(1, samples // p.train_global_batch_size), p.train_micro_batch_size,
                 p.logprob_batch_size, steps_per_epoch, last)


def _end_of_step(cfg: RunConfig) -> tuple[StepJob, ...]:
    g, ck = cfg.loop, cfg.checkpointing
    val = " and ".join(([f"every {g.val_period} steps"] if g.val_period else []) + (["at the end"] * g.val_at_end))
    save = f"every {ck.save_period} steps and at the end" if ck.enabled else "off"
    return (StepJob("refit", "every step"), StepJob("validate", val or "never"),
            StepJob("log", "every step"), StepJob("checkpoint", save))


def _roles(cfg: RunConfig, gen: GeneratorPlan, pools: dict[str, tuple[str, int]], requests: dict[str, float],
           collector_gpus: float, teacher: TeacherPlan | None) -> tuple[Role, ...]:
    p, ray = cfg.policy, cfg.runtime == "ray"
    actors = "Ray actors" if ray else "this process"
    roles = [Role("policy", p.dp_size, actors, f"{p.model_name} on {p.device}",
                  RAY_CPUS["policy"] * ray, requests["policy"])]
    model = "the policy's own module" if gen.shares_policy_module else f"its own copy of {p.model_name} (refit)"
    roles.append(Role("generator", gen.count, actors, f"{p.generation.backend} on {model}",
                      RAY_CPUS["generator"] * ray, requests["generator"]))
    if uses_critic(cfg):
        roles.append(Role("value", p.dp_size, actors, "the policy's trunk with a value head",
                          RAY_CPUS["value"] * ray, requests["value"]))
    if teacher is not None:
        roles.append(Role("teacher", p.dp_size, actors, f"frozen {teacher.options.policy.model_name}",
                          RAY_CPUS["teacher"] * ray, requests["teacher"]))
    if is_async(cfg):
        where = "a Ray actor" if ray else ("a child process" if cfg.grpo.async_grpo.collector_process
                                          else "a thread of the driver")
        roles.append(Role("collector", 1, where, f"its own copy of {p.model_name}", RAY_CPUS["collector"] * ray,
                          collector_gpus))
    roles += [Role(f"env/{name}", n, "Ray actors", env, cfg.env.cpus_per_actor) for name, (env, n) in pools.items()]
    return tuple(roles)


def build_plan(cfg: RunConfig, *, steps_per_epoch: int | None = None, task_names=(), cluster_gpus: float = 0.0,
               settled: Numerics | None = None) -> RunPlan:
    """The plan of ``cfg``: ``steps_per_epoch`` and ``task_names`` from its data, ``cluster_gpus`` from the Ray
    cluster it joined (``runtime: ray``), ``settled``: its :func:`~rlplane.training.numerics.numerics` (else settled
    here, as for a fresh run).
    Under Ray the workers get the model by the absolute path the driver resolves."""
    num = settled or numerics(cfg)
    cfg = settle_precision(cfg, num.precision) if num.precision != "auto" else cfg
    ray = cfg.runtime == "ray"
    if ray:  # workers may be on other nodes: the model by the path the driver resolves
        cfg = with_driver_model_path(cfg)
    p, gen = cfg.policy, cfg.policy.generation
    teacher = teacher_plan(cfg) if cfg.algorithm == "distillation" else None
    if teacher is not None and ray:
        policy = with_driver_model_path(cfg.model_copy(update={"policy": teacher.options.policy})).policy
        teacher = TeacherPlan(dataclasses.replace(teacher.options, policy=policy), teacher.warmup)
    shares = not ray and gen.num_generators == 1 and gen.backend == "hf"
    sleeps = (ray and gen.colocated.enabled) or (gen.backend == "vllm" and gen.vllm_cfg.enable_sleep_mode)
    generators = GeneratorPlan(gen.num_generators, shares, sleeps)
    pools = env_pool_specs(cfg, task_names)
    gpus = num_gpus_per_worker(p.device, cluster_gpus) if ray else 0.0
    tensor_parallel = gen.vllm_cfg.tensor_parallel_size if gen.backend == "vllm" else 1
    requests = gpu_requests(gpus, gen.colocated.enabled, teacher is not None, tensor_parallel)
    collector_gpus = (gpu_requests(gpus, colocated=False, tensor_parallel=tensor_parallel)["generator"]
                      if ray and is_async(cfg) else 0.0)
    roles = _roles(cfg, generators, pools, requests, collector_gpus, teacher)
    index, why = data_plane_index(cfg)
    plane = DataPlanePlan(cfg.data_plane.backend, index if cfg.data_plane.backend == "ray" else "in-process",
                          why if cfg.data_plane.backend == "ray" else "the memory plane's own")
    return RunPlan(
        recipe=recipe_for(cfg).train.partition(":")[0].rpartition(".")[2], runtime=cfg.runtime, seed=cfg.loop.seed,
        roles=roles, sizes=_sizes(cfg, steps_per_epoch), numerics=num, data_plane=plane,
        end_of_step=_end_of_step(cfg), policy=policy_options(cfg),
        value=value_options(cfg) if uses_critic(cfg) else None, teacher=teacher, rollout=rollout_options(cfg),
        generators=generators, weight_check=weight_check_options(cfg), env_pools=pools,
        placement=_placement(cfg, roles, gpus, requests["generator"]) if ray else None,
        distributed=p.dp_size > 1 or p.dtensor_cfg.enabled, sharded_policy=p.dtensor_cfg.enabled and p.dp_size > 1,
        skips_prev_logprob_forward=skips_prev_logprob_forward(cfg),
    )


def _placement(cfg: RunConfig, roles: tuple[Role, ...], gpus_per_rank: float,
               generator_gpus: float) -> placements.PlacementPlan:
    """The run's placement groups, colocated or split as ``policy.generation.colocated.enabled`` says: rank ``i`` of
    every trained role shares bundle ``i``, which holds the policy rank's GPU and a critic rank's own (a teacher
    rank shares the policy's)."""
    ranked = [r for r in roles if r.name in ("policy", "value", "teacher")]
    gen = cfg.policy.generation
    return placements.plan_placement(
        dp_size=cfg.policy.dp_size, num_generators=gen.num_generators, colocated=gen.colocated.enabled,
        rank_cpus={r.name: r.cpus for r in ranked}, generator_cpus=RAY_CPUS["generator"],
        rank_gpus={r.name: gpus_per_rank for r in ranked if r.name != "teacher"}, generator_gpus=generator_gpus,
        num_nodes=cfg.cluster.num_nodes)

