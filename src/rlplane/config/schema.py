"""The configuration tree of a run. Key names follow NeMo RL where the feature is the same.

Defaults live here and only here; presets in ``configs/`` override them. Every model is strict
(unknown keys are errors) and frozen (never mutated after loading). Derived sizes (per-rank batch
sizes, number of optimizer steps per GRPO step) are computed by :func:`rlplane.config.plan` and
printed at start-up, never written back here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlplane.config.algorithms import (
    GRPOAdvEstimatorConfig,
    LossConfig,
    PPOAdvEstimatorConfig,
    RewardScalingConfig,
    RewardShapingConfig,
)
from rlplane.config.base import StrictModel
from rlplane.config.data import DataConfig, task_names_of
from rlplane.config.envs import EnvConfig
from rlplane.config.logger import LoggerConfig
from rlplane.config.policy import (
    OptimizerConfig,
    PolicyConfig,
    SchedulerConfig,
    TinyModelConfig,
    check_grad_norm,
    transformers_packs,
)
from rlplane.config.recipes import RECIPES, owner_of
from rlplane.config.vllm import vllm_cfg_errors

AlgorithmName = Literal[tuple(RECIPES)]  # type: ignore[valid-type]


class RolloutLoopConfig(StrictModel):
    """What every on-policy loop shares: prompts and rollouts per step, validation, sample filters and
    reward transforms. ``grpo.*`` and ``ppo.*`` both carry these keys (NeMo RL's names)."""

    num_prompts_per_step: int = Field(32, ge=1, description="Prompts drawn per step.")
    num_generations_per_prompt: int = Field(8, ge=1, description="Responses per prompt (the group size G).")
    max_rollout_turns: int = Field(1, ge=1, description="Turns per rollout (1 = single turn).")
    max_num_steps: int = Field(150, ge=0, description="Training steps to run.")
    max_num_epochs: int = Field(
        1000, ge=1, description="Passes over the training prompts, at most: the run ends when they are used up, "
        "if that comes before max_num_steps (every generation batch of dynamic sampling counts)."
    )
    val_period: int = Field(50, ge=0, description="Validate every N steps (0 = never mid-run).")
    val_at_start: bool = Field(True, description="Validate before the first step.")
    val_at_end: bool = Field(True, description="Validate after the last step.")
    max_val_samples: int = Field(500, ge=1, description="Validation prompts.")
    val_batch_size: int = Field(500, ge=1, description="Validation prompts per generation call.")
    val_num_generations_per_prompt: int = Field(1, ge=1, description="k > 1 also reports pass@k (sampled).")
    overlong_filtering: bool = Field(False, description="Zero the loss of truncated responses (DAPO).")
    use_dynamic_sampling: bool = Field(False, description="Drop zero-std groups and refill (DAPO).")
    dynamic_sampling_max_gen_batches: int = Field(10, ge=1, description="Generation batches per step, at most.")
    batch_multiplier: int = Field(1, ge=1, description="Dataloader batch = prompts × this (dynamic sampling only).")
    seq_logprob_error_threshold: float | None = Field(None, description="Mask sequences whose mult. "
                                                                        "prob error exceeds this.")
    rollout_failure_policy: Literal["zero_reward", "retry", "drop_group"] = Field(
        "zero_reward", description="A sample whose environment raises or returns something malformed: `zero_reward` "
        "scores it 0; `retry` re-runs its environment step on a fresh environment up to rollout_max_retries times, "
        "then scores 0; `drop_group` drops its prompt group from the step and refills from the next prompts (like "
        "dynamic sampling, at most dynamic_sampling_max_gen_batches batches; async: the collector regenerates)."
    )
    rollout_max_retries: int = Field(
        2, ge=1, description="Environment re-runs per failed step (rollout_failure_policy: retry)."
    )
    skip_reference_policy_logprobs_calculation: bool = Field(
        False, description="Skip reference logprobs (also skipped when the KL penalty is 0)."
    )
    seed: int = Field(42, ge=-(2**63), le=2**64 - 1, description="Seed of the whole run (what torch takes: 64 bits).")
    reward_shaping: RewardShapingConfig = Field(default_factory=RewardShapingConfig, description="DAPO shaping.")
    reward_scaling: RewardScalingConfig = Field(default_factory=RewardScalingConfig, description="Linear rescale.")

    @model_validator(mode="after")
    def _rules(self) -> "RolloutLoopConfig":
        if self.batch_multiplier > 1 and not self.use_dynamic_sampling:
            raise ValueError(
                f"batch_multiplier = {self.batch_multiplier} only applies with dynamic sampling; "
                "set use_dynamic_sampling=true or batch_multiplier=1"
            )
        return self


class AsyncGRPOConfig(StrictModel):
    """Asynchronous GRPO (NeMo RL `grpo.async_grpo.*`): a collector generates for future steps while
    the policy trains; each step trains on groups generated at most `max_trajectory_age_steps` weight
    versions ago, corrected by importance sampling (`loss_fn.use_importance_sampling_correction`)."""

    enabled: bool = Field(False, description="Generate beside training (`recipes/async_grpo.py`) instead of in turn.")
    max_trajectory_age_steps: int = Field(
        1, ge=1, description="How many weight versions old a trained-on trajectory may be (the collector's lead)."
    )
    max_generation_failures: int = Field(
        3, ge=0, description="Consecutive failed generation batches the collector retries before stopping the run."
    )
    # Off: a refit waits until the outgoing weights have generated every step they serve (target t by
    # version t - max_trajectory_age_steps), so a fixed seed replays the same metrics whatever the timing.
    # On: results depend on thread timing (where in a response the weights change), by nature.
    in_flight_weight_updates: bool = Field(
        False, description="A refit swaps the generator's weights at the next token boundary instead of waiting "
        "for the generation in flight (hf and vllm: between two decode steps); each token records its weight version, "
        "a trajectory's age is its oldest token's. Not deterministic: results depend on timing.",
    )
    max_concurrent_scoring: int | None = Field(
        None, ge=1, description="Generation batches the collector may score at once (each batch still fills the "
        "buffer in the order it started, so a run replays). null (default): max_trajectory_age_steps, the steps the "
        "collector may run ahead (1 at the default age: one at a time). Each batch scored at once steps environment "
        "instances of its own (made on first use: N instances, and N verifier pools for math), so an environment "
        "need not be thread-safe.",
    )
    collector_process: bool = Field(
        False, description="runtime: local: run the collector in a child process of its own (off the trainer's "
                          "GIL; it writes into the run's data plane through shared memory); false (default): a "
                          "thread of the trainer's process. On 2 cores the two measured alike at max age 1 (1.68x "
                          "vs 1.72x sync) and the process ahead at max age 2 (2.42x vs 2.33x; benchmarks/"
                          "async_grpo.py --collector both). runtime: ray: ignored.",
    )

    def scoring_concurrency(self) -> int:
        """Batches scored at once: ``max_concurrent_scoring``, or the age bound where that is null. At max age
        1 an async step is bound by one judge call or by half the chain train → generate → score → train (2 at
        once measured no faster on 2 cores); at max age k, scoring k at once lets the collector use its lead."""
        return self.max_concurrent_scoring or self.max_trajectory_age_steps


class GRPOConfig(RolloutLoopConfig):
    """The GRPO loop (NeMo RL `grpo.*`): the shared rollout knobs plus group-baseline advantages."""

    advantage_clip_low: float | None = Field(None, description="Clamp advantages below (null = off).")
    advantage_clip_high: float | None = Field(None, description="Clamp advantages above (null = off).")
    adv_estimator: GRPOAdvEstimatorConfig = Field(default_factory=GRPOAdvEstimatorConfig, description="Advantages.")
    async_grpo: AsyncGRPOConfig = Field(default_factory=AsyncGRPOConfig, description="Asynchronous generation.")

    @model_validator(mode="after")
    def _clip_order(self) -> "GRPOConfig":
        lo, hi = self.advantage_clip_low, self.advantage_clip_high
        if lo is not None and hi is not None and lo >= hi:
            raise ValueError(f"advantage_clip_low = {lo} >= advantage_clip_high = {hi}; make low < high")
        return self


class PPOConfig(RolloutLoopConfig):
    """The PPO loop (NeMo RL `ppo.*`): the shared rollout knobs plus GAE and several epochs per rollout."""

    ppo_epochs: int = Field(4, description="Passes of critic then actor training over each rollout (>= 1).")
    policy_training_start_step: int = Field(
        0, ge=0, description="Critic-only warm-up: the actor trains from this step on (steps counted from 0)."
    )
    adv_estimator: PPOAdvEstimatorConfig = Field(default_factory=PPOAdvEstimatorConfig,
                                                 description="GAE or raw reward.")

    @model_validator(mode="after")
    def _epochs(self) -> "PPOConfig":
        if self.ppo_epochs < 1:
            raise ValueError(
                f"ppo.ppo_epochs = {self.ppo_epochs}: each rollout needs at least one training pass "
                "(NeMo RL uses 4); set ppo.ppo_epochs >= 1"
            )
        return self


class ValueLossConfig(StrictModel):
    """The critic's clipped MSE (NeMo RL `value_loss_fn`): ``0.5·scale·max((v−R)², (v_clip−R)²)``."""

    scale: float = Field(1.0, gt=0, description="Multiplier of the value loss (NeMo RL's PPO example: 0.4).")
    cliprange: float | None = Field(
        None, description="Clip the new values to old ± cliprange before the loss (null or 0 = no clipping)."
    )

    @model_validator(mode="after")
    def _cliprange(self) -> "ValueLossConfig":
        if self.cliprange is not None and self.cliprange < 0:
            raise ValueError(f"cliprange = {self.cliprange}: needs a value >= 0 (0.2 is usual) or null")
        return self


class ValueConfig(StrictModel):
    """The PPO critic: the policy's architecture with a scalar head (`num_labels = 1`), its own optimizer.

    It starts from the policy's initial weights (the warm-up checkpoint, or ``policy.model_name``)
    with a zero head, so V ≡ 0 at step 0. Batch sizes and DP size are the policy's.
    """

    optimizer: OptimizerConfig = Field(
        default_factory=lambda: OptimizerConfig(lr=1e-3), description="AdamW settings of the critic."
    )
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig, description="LR schedule of the critic.")
    max_grad_norm: float | None = Field(1.0, description="Gradient-norm clip of the critic, > 0 (null = off).")

    @model_validator(mode="after")
    def _grad_norm(self) -> ValueConfig:
        check_grad_norm(self.max_grad_norm)
        return self
    loss_fn: ValueLossConfig = Field(default_factory=ValueLossConfig, description="Value loss scale and clipping.")


class WarmupConfig(StrictModel):
    """Supervised warm-up (NLL on reference answers) before RL, so the tiny model has reward signal."""

    enabled: bool = Field(True, description="Run the supervised stage before RL.")
    num_steps: int = Field(1500, ge=0, description="Optimizer steps at most.")
    batch_size: int = Field(128, ge=1, description="Problems per step.")
    lr: float = Field(3e-3, gt=0, description="AdamW learning rate.")
    warmup_steps: int = Field(100, ge=0, description="Linear lr warm-up steps.")
    target_accuracy: float | None = Field(
        0.35, ge=0, le=1, description="Stop once held-out greedy accuracy reaches this (null = run all steps)."
    )
    eval_every: int = Field(50, ge=1, description="Steps between accuracy checks.")
    eval_samples: int = Field(200, ge=1, description="Held-out problems per check.")


class DistillationConfig(RolloutLoopConfig):
    """The on-policy distillation loop: the shared rollout knobs (the student generates, the teacher scores)."""


class TeacherConfig(StrictModel):
    """The frozen teacher of on-policy distillation: its own model (same tokenizer as the student),
    warmed up like the student when it is the embedded model."""

    model_name: str = Field("embedded:tiny-llama", description="HF directory, hub id or `embedded:tiny-llama`.")
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig, description="Shape of the embedded teacher.")
    warmup: WarmupConfig = Field(
        default_factory=lambda: WarmupConfig(target_accuracy=0.9), description="Supervised warm-up of the teacher."
    )


class DataPlaneConfig(StrictModel):
    """Where per-sample columns live during a step (NeMo RL `data_plane.*`)."""

    backend: Literal["memory", "ray"] = Field("memory", description="`memory` (in-process) or `ray` (object store).")
    index: Literal["auto", "store", "driver"] = Field(
        "auto", description="`ray` only: where the key index lives. `store`: a store actor every process asks; "
        "`driver`: the driver's client, so workers read the metas it sends and return their writes' receipts with "
        "no store round trips (one driver; not with grpo.async_grpo, whose collector clears keys itself); `auto`: "
        "`driver` where the recipe's driver owns every key (sync GRPO, PPO, distillation), else `store` "
        "(`config/plan.py: data_plane_index`; the choice is printed at start-up).")


class ClusterConfig(StrictModel):
    """Ray resources for `runtime: ray` (NeMo RL `cluster.*`)."""

    num_cpus: int | None = Field(None, ge=1, description="CPUs Ray may use (null = all).")
    address: str | None = Field(None, description="Existing Ray cluster to join (null = start one).")
    gpus_per_node: int = Field(0, ge=0, description="GPUs Ray may use on this node (0 = none; `policy.device: auto` "
                               "then computes on CPU).")
    num_nodes: int = Field(1, ge=1, description="Nodes the run's placement groups may spread over; the Ray cluster "
                           "must have at least this many.")


class CheckpointingConfig(StrictModel):
    """Periodic, atomic checkpoints (NeMo RL `checkpointing.*`)."""

    enabled: bool = Field(True, description="Write checkpoints.")
    checkpoint_dir: str | None = Field(None, description="Where (null = RUN_DIR/checkpoints).")
    save_period: int = Field(50, ge=1, description="Save every N steps (and at the end).")
    keep_top_k: int | None = Field(3, ge=1, description="Keep the best K by metric_name, plus the latest.")
    metric_name: str = Field("val:accuracy", description="`val:NAME` or `train:NAME` to rank checkpoints.")
    higher_is_better: bool = Field(True, description="Direction of metric_name.")
    resume: bool = Field(False, description="Continue from the latest complete checkpoint.")

    @model_validator(mode="after")
    def _metric_prefix(self) -> "CheckpointingConfig":
        if not self.metric_name.startswith(("val:", "train:")):
            raise ValueError(
                f"metric_name = {self.metric_name!r} must start with 'val:' or 'train:' (e.g. 'val:accuracy')"
            )
        return self


class RunConfig(StrictModel):
    """A whole run."""

    algorithm: AlgorithmName = Field("grpo", description="Which recipe (`config/recipes.py`): "
                                                         "grpo, ppo or distillation.")
    runtime: Literal["local", "ray"] = Field("local", description="Workers in this process, or as Ray actors.")
    run_dir: str = Field("runs/grpo-arithmetic", description="Where checkpoints, logs and the summary go.")
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    grpo: GRPOConfig | None = Field(None, description="The GRPO loop (filled with defaults when algorithm: grpo).")
    ppo: PPOConfig | None = Field(None, description="The PPO loop (filled with defaults when algorithm: ppo).")
    value: ValueConfig | None = Field(None, description="The PPO critic (filled with defaults when algorithm: ppo).")
    distillation: DistillationConfig | None = Field(None, description="The distillation loop "
                                                                      "(algorithm: distillation).")
    teacher: TeacherConfig | None = Field(None, description="The distillation teacher (algorithm: distillation).")
    loss_fn: LossConfig = Field(default_factory=LossConfig)
    warmup: WarmupConfig = Field(default_factory=WarmupConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    env: EnvConfig = Field(default_factory=EnvConfig, description="Per-environment settings, by task_name.")
    data_plane: DataPlaneConfig = Field(default_factory=DataPlaneConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    checkpointing: CheckpointingConfig = Field(default_factory=CheckpointingConfig)
    logger: LoggerConfig = Field(default_factory=LoggerConfig)

    @model_validator(mode="before")
    @classmethod
    def _fill_active_sections(cls, data):
        """The chosen algorithm's sections default to ``{}``; the other algorithm's stay null (unset)."""
        if isinstance(data, dict):
            recipe = RECIPES.get(data.get("algorithm", "grpo"))
            active = (recipe.loop, *recipe.sections) if recipe else ()
            data = {**data, **{k: {} for k in active if data.get(k) is None}}
        return data

    @property
    def loop(self) -> RolloutLoopConfig:
        """The active loop section (the recipe's ``loop`` in ``config/recipes.py``)."""
        return getattr(self, RECIPES[self.algorithm].loop)

    @model_validator(mode="after")
    def _cross_section(self) -> "RunConfig":
        errors = []
        algo, mine = self.algorithm, (RECIPES[self.algorithm].loop, *RECIPES[self.algorithm].sections)
        shared = set(RolloutLoopConfig.model_fields)
        others = dict.fromkeys(s for r in RECIPES.values() for s in (r.loop, *r.sections) if s not in mine)
        for section in others:
            given = getattr(self, section)
            if given is None:
                continue
            other_algo = owner_of(section)
            keys = sorted(given.model_fields_set)
            moved = [k for k in keys if section == RECIPES[other_algo].loop and k in shared]
            only = [k for k in keys if k not in moved]
            if moved:
                errors.append(
                    f"{', '.join(f'{section}.{k}' for k in moved)}: with algorithm = {algo} the loop settings live "
                    f"under {algo}.*; use {', '.join(f'{algo}.{k}' for k in moved)} (or set algorithm={other_algo})"
                )
            if only or not moved:
                errors.append(
                    f"{', '.join(f'{section}.{k}' for k in only) or section}: "
                    f"{other_algo.upper()}-only keys with algorithm = "
                    f"{algo}; remove them (or set algorithm={other_algo})"
                )
        if errors:  # the rest would judge the wrong section
            raise ValueError("\n".join(errors))
        p, g, name = self.policy, self.loop, self.algorithm
        samples = g.num_prompts_per_step * g.num_generations_per_prompt
        if samples % p.train_global_batch_size:
            errors.append(
                f"policy.train_global_batch_size = {p.train_global_batch_size} does not divide "
                f"{name}.num_prompts_per_step × num_generations_per_prompt "
                f"= {samples}; make it a divisor (e.g. {samples})"
            )
        per_rank = p.train_global_batch_size // p.dp_size
        if p.train_global_batch_size % p.dp_size:
            errors.append(
                f"policy.train_global_batch_size = {p.train_global_batch_size} is not divisible by "
                f"policy.dp_size = {p.dp_size}; make it a multiple"
            )
        elif per_rank % min(p.train_micro_batch_size, per_rank):
            errors.append(
                f"policy.train_micro_batch_size = {p.train_micro_batch_size} does not divide the per-rank batch "
                f"{per_rank} (= train_global_batch_size / dp_size); pick a divisor"
            )
        if p.lora.enabled and self.warmup.enabled:
            errors.append("policy.lora.enabled with warmup.enabled: the warm-up trains every weight, which an adapter "
                          "checkpoint does not hold; set warmup.enabled=false (or policy.lora.enabled=false)")
        if self.data_plane.index == "driver" and self.data_plane.backend != "ray":
            errors.append("data_plane.index = driver needs data_plane.backend = ray (the memory plane's index is in "
                          "the driver already); set data_plane.backend=ray or data_plane.index=store")
        if self.data_plane.index == "driver" and self.grpo is not None and self.grpo.async_grpo.enabled:
            errors.append("data_plane.index = driver with grpo.async_grpo.enabled: the async collector reads and "
                          "clears keys in its own process, which needs the store actor; set data_plane.index=store")
        if self.runtime == "ray" and self.data_plane.backend == "memory":
            errors.append("runtime: ray needs data_plane.backend: ray (workers in other processes cannot see "
                          "in-process memory); set data_plane.backend=ray")
        if p.generation.max_new_tokens >= p.max_total_sequence_length:
            # A prompt has at least one token, so a response never gets max_new_tokens: it would be cut silently.
            errors.append(
                f"policy.generation.max_new_tokens = {p.generation.max_new_tokens} leaves no room for a prompt in "
                f"policy.max_total_sequence_length = {p.max_total_sequence_length} (prompt + response); raise "
                f"max_total_sequence_length above max_new_tokens + the longest prompt, or lower max_new_tokens"
            )
        if p.dynamic_batching.enabled and p.sequence_packing.enabled:
            errors.append("policy.dynamic_batching.enabled and policy.sequence_packing.enabled are exclusive (NeMo "
                          "RL's rule: both decide the micro-batches); disable one of them")
        if p.sequence_packing.enabled and not transformers_packs():
            errors.append("policy.sequence_packing.enabled needs transformers' packed-sequence masks "
                          "(masking_utils.find_packed_sequence_indices, transformers >= 4.54); upgrade "
                          "transformers or use policy.dynamic_batching instead")
        for key in ("dynamic_batching", "sequence_packing"):
            tb = getattr(p, key)
            if tb.enabled and p.dtensor_cfg.enabled and p.dp_size > 1:
                errors.append(f"policy.{key}.enabled with policy.dtensor_cfg.enabled: ranks would run different "
                              "numbers of training forwards, which FSDP's collectives cannot; disable one of them")
            for budget in ("train_mb_tokens", "logprob_mb_tokens"):
                value = getattr(tb, budget)
                if tb.enabled and value is not None and value < p.max_total_sequence_length:
                    errors.append(f"policy.{key}.{budget} = {value} < policy.max_total_sequence_length = "
                                  f"{p.max_total_sequence_length}: the longest sequence must fit one micro-batch; "
                                  f"raise it (or leave it null)")
        if p.dtensor_cfg.enabled and p.lora.enabled:
            errors.append("policy.dtensor_cfg.enabled with policy.lora.enabled is not supported yet (the adapter "
                          "refit and checkpoints assume an unsharded model); disable one of them")
        if p.dtensor_cfg.enabled and self.runtime == "local":
            errors.append("policy.dtensor_cfg.enabled needs runtime: ray (the in-process generator shares the "
                          "policy's unsharded module); set runtime=ray or policy.dtensor_cfg.enabled=false")
        if p.dtensor_cfg.enabled and name == "grpo" and g.async_grpo.enabled:
            errors.append("policy.dtensor_cfg.enabled is not supported with grpo.async_grpo.enabled (the collector "
                          "refits from rank 0 alone, an FSDP gather needs every rank); disable one of them")
        if p.generation.backend == "vllm":
            errors.extend(vllm_cfg_errors(p.device, p.generation.vllm_cfg))
        if p.dp_size > 1 and self.runtime == "local":
            errors.append(f"policy.dp_size = {p.dp_size} needs runtime: ray; set runtime=ray or policy.dp_size=1")
        if name == "grpo":
            errors.extend(_estimator_errors(self))
        if name == "grpo" and g.num_generations_per_prompt == 1 and g.adv_estimator.name != "reinforce_plus_plus":
            errors.append(f"grpo.num_generations_per_prompt = 1: a group of one response has advantage 0 under "
                          f"grpo.adv_estimator.name = {g.adv_estimator.name} (nothing is learned); use 2 or more, "
                          "or grpo.adv_estimator.name=reinforce_plus_plus")
        if g.seq_logprob_error_threshold is not None and self.loss_fn.force_on_policy_ratio:
            errors.append(f"{name}.seq_logprob_error_threshold needs prev logprobs, which "
                          "loss_fn.force_on_policy_ratio "
                          "skips; unset one of them")
        if self.loss_fn.force_on_policy_ratio and samples != p.train_global_batch_size:
            errors.append(
                "loss_fn.force_on_policy_ratio needs one optimizer step per rollout: set "
                f"policy.train_global_batch_size = {samples} (prompts × generations)"
            )
        lf = self.loss_fn
        if lf.use_kl_in_reward and lf.reference_policy_kl_penalty != 0 and g.skip_reference_policy_logprobs_calculation:
            errors.append("loss_fn.use_kl_in_reward needs reference logprobs, which "
                          f"{name}.skip_reference_policy_logprobs_calculation skips; unset one of them")
        if self.loss_fn.force_on_policy_ratio and name == "ppo" and g.ppo_epochs > 1:
            errors.append(
                f"loss_fn.force_on_policy_ratio needs one optimizer step per rollout, but ppo.ppo_epochs = "
                f"{g.ppo_epochs}; set ppo.ppo_epochs=1 or loss_fn.force_on_policy_ratio=false"
            )
        if name == "distillation" and samples != p.train_global_batch_size:
            errors.append(
                "distillation needs one optimizer step per rollout (the sampled reverse KL is on-policy only for "
                f"the weights that sampled it): set policy.train_global_batch_size = {samples} (prompts × generations)"
            )
        if name == "grpo" and g.async_grpo.enabled:
            errors.extend(_async_grpo_errors(self))
            if p.generation.num_generators > 1:
                errors.append(f"policy.generation.num_generators = {p.generation.num_generators} with "
                              "grpo.async_grpo.enabled: the async collector is one generator; set num_generators=1")
        if errors:
            raise ValueError("\n".join(errors))
        return self


def _estimator_errors(cfg: RunConfig) -> list[str]:
    """What ``grpo.adv_estimator.name`` needs from the environments and the KL settings."""
    from rlplane.envs.registry import reward_component_names

    est, lf, errors = cfg.grpo.adv_estimator, cfg.loss_fn, []
    if est.name == "gdpo":
        for task in dict.fromkeys(task_names_of(cfg.data)):
            names = reward_component_names(task)
            if names is not None and len(names) < 2:
                errors.append(
                    f"grpo.adv_estimator.name = gdpo: environment {task!r} gives {len(names)} reward components "
                    f"{list(names)}, GDPO needs at least 2 (task 'arithmetic' gives correct and format); use such "
                    "an environment or set grpo.adv_estimator.name=grpo"
                )
    kl_in_reward = lf.use_kl_in_reward and lf.reference_policy_kl_penalty != 0
    if kl_in_reward and est.name != "reinforce_plus_plus":
        errors.append(
            f"loss_fn.use_kl_in_reward puts the KL in the reward of reinforce_plus_plus (or PPO's GAE); with "
            f"grpo.adv_estimator.name = {est.name} the KL would be dropped; set loss_fn.use_kl_in_reward=false "
            "or grpo.adv_estimator.name=reinforce_plus_plus"
        )
    if kl_in_reward and lf.force_on_policy_ratio:
        errors.append("loss_fn.use_kl_in_reward needs prev logprobs, which "
                      "loss_fn.force_on_policy_ratio skips; unset one of them")
    return errors


def _async_grpo_errors(cfg: RunConfig) -> list[str]:
    """What async GRPO cannot run with (NeMo RL asserts the first two as well)."""
    errors = []
    if not cfg.loss_fn.use_importance_sampling_correction:
        errors.append("grpo.async_grpo.enabled needs loss_fn.use_importance_sampling_correction=true (trajectories "
                      "come from older weights; the IS weight π_old/π_gen corrects for it); set it to true")
    if cfg.grpo.use_dynamic_sampling:
        errors.append("grpo.use_dynamic_sampling cannot run with grpo.async_grpo.enabled (the collector serves whole "
                      "steps ahead of time, there is no refill); set one of them to false")
    if cfg.loss_fn.force_on_policy_ratio:
        errors.append("loss_fn.force_on_policy_ratio cannot run with grpo.async_grpo.enabled (async recomputes the "
                      "prev logprobs with the current weights); set it to false")
    if cfg.policy.generation.backend == "vllm" and cfg.policy.generation.vllm_cfg.enable_sleep_mode:
        errors.append("policy.generation.vllm_cfg.enable_sleep_mode cannot run with grpo.async_grpo.enabled (the "
                      "collector generates while the policy trains, so the engine never sleeps); set it to false")
    return errors
