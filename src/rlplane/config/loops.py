"""The loop sections (``grpo``, ``ppo``, ``distillation``): what every on-policy loop shares and what each adds."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlplane.config.algorithms import (
    GRPOAdvEstimatorConfig,
    PPOAdvEstimatorConfig,
    RewardScalingConfig,
    RewardShapingConfig,
)
from rlplane.config.base import StrictModel


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
    val_period: int = Field(50, description="Validate every N steps (0 or below = never mid-run, as NeMo RL).")
    val_at_start: bool = Field(True, description="Validate before the first step.")
    val_at_end: bool = Field(True, description="Validate after the last step.")
    max_val_samples: int = Field(500, ge=1, description="Validation prompts.")
    val_batch_size: int = Field(500, ge=1, description="Validation prompts per generation call.")
    val_num_generations_per_prompt: int = Field(1, ge=1, description="k > 1 also reports pass@k (sampled).")
    overlong_filtering: bool = Field(False, description="Zero the loss of truncated responses (DAPO).")
    use_dynamic_sampling: bool = Field(False, description="Drop zero-std groups and refill (DAPO).")
    dynamic_sampling_max_gen_batches: int = Field(10, ge=1, description="Generation batches per step, at most.")
    batch_multiplier: int = Field(1, ge=1, description="Dataloader batch = prompts × this (dynamic sampling only).")
    dynamic_sampling_shortfall: Literal["error", "fill"] = Field(
        "error", description="Dynamic sampling still short after dynamic_sampling_max_gen_batches: `error` stops the "
        "run (NeMo RL); `fill` trains on the kept groups topped up with all-equal ones (zero advantage), so a policy "
        "that has become sure of most prompts keeps training on the rest.")
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
    watchdog_s: float | None = Field(
        3600.0, gt=0, description="Seconds a step may go without progress (no worker call returning) before the run "
        "dumps every worker's stack to logs/stacks.txt and stops naming the stuck worker (null = never). Above "
        "policy.generation.timeout_s, so a hung generate call is named by its own deadline first."
    )
    skip_reference_policy_logprobs_calculation: bool = Field(
        False, description="Skip reference logprobs (also skipped when the KL penalty is 0)."
    )
    seed: int = Field(42, ge=-(2**63), le=2**64 - 1, description="Seed of the whole run (what torch takes: 64 bits).")
    reward_shaping: RewardShapingConfig = Field(default_factory=RewardShapingConfig, description="DAPO shaping.")
    reward_scaling: RewardScalingConfig = Field(default_factory=RewardScalingConfig, description="Linear rescale.")
    reward_control: Literal["permute", "coin"] | None = Field(
        None, description="A control run: the rewards replaced, before scaling, shaping and dynamic sampling, by ones "
        "that carry no information about which response earned them. `permute`: each generation batch's rewards "
        "shuffled among its samples (same values, mean and spread); `coin`: each reward redrawn as the batch's "
        "highest with probability (mean - lowest) / (highest - lowest), else its lowest (0/1 rewards: a coin with "
        "the batch's mean). train/reward and validation stay the true task's. A recipe whose gain its control "
        "matches has not learned from the reward (`rlplane sweep --control`). null: the real rewards.")
    stop_at_validation_metric: str | None = Field(
        None, description="End the run once this validation metric (accuracy, pass@k, env/<task>/<name>) reaches "
        "stop_at_validation_threshold (NeMo RL's early stop; checked at every validation, the first included)."
    )
    stop_at_validation_threshold: float | None = Field(None, description="See stop_at_validation_metric.")

    def samples_per_step(self) -> int:
        """prompts × generations: the samples a step trains on (the run plan's ``sizes.samples_per_step``)."""
        return self.num_prompts_per_step * self.num_generations_per_prompt

    def validates_after(self, done: int) -> bool:
        """Whether the periodic validation falls after ``done`` steps (``val_period`` <= 0: never)."""
        return self.val_period > 0 and done % self.val_period == 0

    @model_validator(mode="after")
    def _rules(self) -> "RolloutLoopConfig":
        if self.batch_multiplier > 1 and not self.use_dynamic_sampling:
            raise ValueError(
                f"batch_multiplier = {self.batch_multiplier} only applies with dynamic sampling; "
                "set use_dynamic_sampling=true or batch_multiplier=1"
            )
        if self.dynamic_sampling_shortfall == "fill" and not self.use_dynamic_sampling:
            raise ValueError("dynamic_sampling_shortfall = fill only applies with dynamic sampling; "
                             "set use_dynamic_sampling=true or leave the shortfall at error")
        if self.dynamic_sampling_shortfall == "fill" and self.rollout_failure_policy == "drop_group":
            raise ValueError("dynamic_sampling_shortfall = fill cannot top up with failed groups (their rewards are "
                             "not real): with rollout_failure_policy = drop_group leave the shortfall at error")
        if (self.stop_at_validation_metric is None) != (self.stop_at_validation_threshold is None):
            raise ValueError("stop_at_validation_metric and stop_at_validation_threshold go together: "
                             "set both (early stop at a threshold) or neither")
        return self


class EarlyStopConfig(StrictModel):
    """Stop a run whose validation metric stopped improving or fell (``rlplane train --early-stop``)."""

    enabled: bool = Field(False, description="Check the rule below at every validation.")
    metric: str = Field("accuracy", description="The validation metric watched (higher is better): accuracy, "
                        "pass@k (val_num_generations_per_prompt = k > 1) or env/<task>/<name>.")
    patience: int = Field(3, ge=1, description="Stop after this many validations in a row without a new best "
                                               "(better than the best so far by more than min_delta).")
    min_delta: float = Field(0.0, ge=0, description="How much better than the best a validation must be to count.")
    max_drop: float | None = Field(None, ge=0, description="Stop at once when the metric falls more than this "
                                                           "below the best so far (null: no drop rule).")


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
    # Off: a refit waits until the outgoing weights generated every step they serve, so a fixed seed replays
    # the same metrics; on: results depend on thread timing.
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
                          "thread of the trainer's process (docs/benchmarks.md compares the two). runtime: ray: "
                          "ignored.",
    )

    def scoring_concurrency(self) -> int:
        """Batches scored at once: ``max_concurrent_scoring``, or the age bound where that is null (lets the
        collector use its lead)."""
        return self.max_concurrent_scoring or self.max_trajectory_age_steps


class GRPOConfig(RolloutLoopConfig):
    """The GRPO loop (NeMo RL `grpo.*`): the shared rollout knobs plus group-baseline advantages."""

    advantage_clip_low: float | None = Field(None, description="Clamp advantages below (null = off).")
    advantage_clip_high: float | None = Field(None, description="Clamp advantages above (null = off).")
    adv_estimator: GRPOAdvEstimatorConfig = Field(default_factory=GRPOAdvEstimatorConfig, description="Advantages.")
    async_grpo: AsyncGRPOConfig = Field(default_factory=AsyncGRPOConfig, description="Asynchronous generation.")
    invalid_tool_call_advantage: float | None = Field(
        None, description="NeMo RL's message-level penalty; refused when set, as NeMo RL's data-plane trainer does."
    )
    malformed_thinking_advantage: float | None = Field(
        None, description="NeMo RL's message-level penalty; refused when set, as NeMo RL's data-plane trainer does."
    )

    @model_validator(mode="after")
    def _clip_order(self) -> "GRPOConfig":
        lo, hi = self.advantage_clip_low, self.advantage_clip_high
        if lo is not None and hi is not None and lo >= hi:
            raise ValueError(f"advantage_clip_low = {lo} >= advantage_clip_high = {hi}; make low < high")
        return self

    @model_validator(mode="after")
    def _no_message_level_penalties(self) -> "GRPOConfig":
        # NeMo RL's grpo_train_sync raises NotImplementedError on these: the penalties need the legacy
        # trainer's message logs on the driver; a data-plane trainer holds receipts and (B,) tensors.
        given = [f"grpo.{k} = {v}" for k in PENALTY_KEYS if (v := getattr(self, k)) is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: message-level advantage penalties are not supported by the "
                             "data-plane GRPO trainer (NeMo RL's grpo_train_sync refuses them too); score invalid "
                             "tool calls or malformed thinking in the environment's reward, or set them to null")
        return self


PENALTY_KEYS = ("invalid_tool_call_advantage", "malformed_thinking_advantage")


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


class DistillationConfig(RolloutLoopConfig):
    """The on-policy distillation loop: the shared rollout knobs (the student generates, the teacher scores)."""

    topk_logits_k: int = Field(64, ge=1, description="Teacher logits kept per token for the top-k KL (the k largest, "
                                                     "with their token ids, moved through the data plane; a k above "
                                                     "the vocabulary keeps all of it: the full KL); unused with "
                                                     "loss_fn.kl_type = sampled_reverse.")

    @model_validator(mode="after")
    def _no_reward_control(self) -> "DistillationConfig":
        if self.reward_control is not None:
            raise ValueError(f"reward_control = {self.reward_control}: distillation trains on the teacher's logprobs, "
                             "not on a reward, so there is no reward to replace; its control is a teacher that knows "
                             "nothing (teacher.warmup.enabled=false, what `rlplane sweep --control` runs), or set "
                             "reward_control to null")
        return self
