"""The configuration tree of a run; key names follow NeMo RL where the feature is the same.

Defaults live only here (presets override them); models are strict and frozen. Derived sizes are computed
by the run plan (:mod:`rlplane.training.plan`), printed at start-up, never written back.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlplane.config.algorithms import LossConfig
from rlplane.config.base import StrictModel
from rlplane.config.data import DataConfig, DatasetOptions
from rlplane.config.envs import EnvConfig
from rlplane.config.logger import LoggerConfig
from rlplane.config.loops import (  # noqa: F401 (AsyncGRPOConfig: re-exported with the other sections)
    AsyncGRPOConfig,
    DistillationConfig,
    EarlyStopConfig,
    GRPOConfig,
    PPOConfig,
    RolloutLoopConfig,
)
from rlplane.config.policy import OptimizerConfig, PolicyConfig, SchedulerConfig, TinyModelConfig, check_grad_norm
from rlplane.config.recipes import RECIPES
from rlplane.config.rules import broken_rules

AlgorithmName = Literal[tuple(RECIPES)]  # type: ignore[valid-type]


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
    loss_fn: ValueLossConfig = Field(default_factory=ValueLossConfig, description="Value loss scale and clipping.")

    @model_validator(mode="after")
    def _grad_norm(self) -> ValueConfig:
        check_grad_norm(self.max_grad_norm)
        return self


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
        "(the run plan's `data_plane_index`; the choice is printed at start-up).")


class ClusterConfig(StrictModel):
    """Ray resources for `runtime: ray` (NeMo RL `cluster.*`)."""

    num_cpus: int | None = Field(None, ge=1, description="CPUs Ray may use (null = all).")
    address: str | None = Field(None, description="Existing Ray cluster to join (null = start one).")
    gpus_per_node: int = Field(0, ge=0, description="GPUs Ray may use on this node (0 = the GPUs Ray finds: none on "
                               "a machine without one, where `policy.device: auto` computes on CPU).")
    num_nodes: int = Field(1, ge=1, description="Nodes the run's placement groups may spread over; the Ray cluster "
                           "must have at least this many.")
    connect_timeout_s: float = Field(30.0, gt=0, description="Seconds the Ray head at `address` (or RAY_ADDRESS) has "
                                     "to accept the connection and answer, before the run stops with an error.")


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


class ExpectedResultConfig(StrictModel):
    """What healthy runs of a preset gained over seeds (``rlplane sweep``, docs/benchmarks.md), printed after
    ``rlplane train`` beside the run's own gain so a user can tell luck from a fault. Presets fill it."""

    preset: str | None = Field(None, description="The preset the figures are for; runs that change it (beyond seed, "
                               "run_dir, logging, checkpoints, placement) are told the figures may not apply.")
    gain_low: float | None = Field(None, ge=-1, le=1, description="The worst seed's gain in held-out accuracy "
                                                                  "(0.31 = +31 points).")
    gain_high: float | None = Field(None, ge=-1, le=1, description="The best seed's gain.")
    seeds: int | None = Field(None, ge=1, description="How many seeds the range covers.")
    control_gain: float | None = Field(None, ge=-1, le=1, description="What the preset's control gained (rewards that "
                                       "carry no information, or an untrained teacher).")
    measured_on: str | None = Field(None, description="The machines the seeds ran on.")

    @model_validator(mode="after")
    def _range(self) -> "ExpectedResultConfig":
        if (self.gain_low is None) != (self.gain_high is None):
            raise ValueError("gain_low and gain_high go together: set both (the range over seeds) or neither")
        if self.gain_low is not None and self.gain_low > self.gain_high:
            raise ValueError(f"gain_low = {self.gain_low} > gain_high = {self.gain_high}; the low end comes first")
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
    early_stop: EarlyStopConfig = Field(default_factory=EarlyStopConfig, description="Stop on a validation "
                                                                                     "plateau or drop.")
    expected: ExpectedResultConfig = Field(default_factory=ExpectedResultConfig,
                                           description="What healthy runs of the preset gain (printed at the end).")

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

    def dataset_options(self) -> DatasetOptions:
        """What the datasets read: ``data``, ``env``, the loop's seed and sizes, the prompt length cap."""
        g = self.loop
        return DatasetOptions(data=self.data, env=self.env, seed=g.seed,
                              prompts_per_batch=g.num_prompts_per_step * g.batch_multiplier,
                              max_val_samples=g.max_val_samples,
                              max_prompt_length=self.policy.max_total_sequence_length - 1)

    @model_validator(mode="after")
    def _cross_section(self) -> "RunConfig":
        """The rules that tie sections together (:mod:`rlplane.config.rules`), every broken one at once."""
        errors = broken_rules(self)
        if errors:
            raise ValueError("\n".join(errors))
        return self
