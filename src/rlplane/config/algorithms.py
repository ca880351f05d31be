"""Config models for the RL math (``loss_fn``, ``grpo.adv_estimator``, ``grpo.reward_shaping``,
``grpo.reward_scaling``, ``ppo.adv_estimator``), with NeMo RL's names and defaults.

``LossConfig`` is generated from :class:`~rlplane.algorithms.loss_options.ClippedPGOptions`; each model
feeds the matching function of :mod:`rlplane.algorithms`.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

import pydantic
from pydantic import Field, model_validator

from rlplane.algorithms.loss_options import ClippedPGOptions, DistillationLossOptions
from rlplane.config.base import StrictModel


class _LossOptionsModel(StrictModel):
    @model_validator(mode="after")
    def _check(self):
        # Each dataclass checks every rule; their ValueErrors list each broken one.
        self.options()
        self.distillation_options()
        return self

    def options(self) -> ClippedPGOptions:
        """The frozen clipped-PG options the workers' loss takes (checked when made: once per run)."""
        return ClippedPGOptions(**self.model_dump(include=_fields(ClippedPGOptions)))

    def distillation_options(self) -> DistillationLossOptions:
        """The distillation loss's options (``algorithm: distillation``)."""
        return DistillationLossOptions(**self.model_dump(include=_fields(DistillationLossOptions)))


def _fields(options: type) -> set[str]:
    return {f.name for f in dataclasses.fields(options)}


def _loss_config() -> type[_LossOptionsModel]:
    """``loss_fn`` as a strict pydantic model built from :class:`ClippedPGOptions`' fields and
    :class:`DistillationLossOptions`' (written once, there)."""
    fields = {}
    for options in (ClippedPGOptions, DistillationLossOptions):
        hints = typing.get_type_hints(options)
        fields.update({f.name: (hints[f.name], Field(f.default, description=f.metadata["doc"]))
                       for f in dataclasses.fields(options)})
    return pydantic.create_model("LossConfig", __base__=_LossOptionsModel, __doc__=ClippedPGOptions.__doc__,
                                 __module__=__name__, **fields)


LossConfig = _loss_config()


class GRPOAdvEstimatorConfig(StrictModel):
    """``grpo.adv_estimator``: which advantage estimator GRPO uses."""

    name: Literal["grpo", "gdpo", "reinforce_plus_plus"] = Field("grpo", description="grpo (group-normalised), gdpo "
                                                                                     "(per reward component; needs "
                                                                                     "an environment with reward "
                                                                                     "components, e.g. arithmetic) or "
                                                                                     "reinforce_plus_plus (group mean "
                                                                                     "+ global whitening over tokens; "
                                                                                     "with loss_fn.use_kl_in_reward "
                                                                                     "the KL goes into the reward).")
    normalize_rewards: bool = Field(True, description="grpo: divide r − b by the group std + 1e-6 where std > 0.")
    use_leave_one_out_baseline: bool = Field(True, description="grpo/gdpo: baseline and std over the other samples of "
                                                               "the group (RLOO-style) instead of all of them "
                                                               "(reinforce_plus_plus always "
                                                               "uses the whole group mean).")
    reward_weights: list[float] | None = Field(None, description="gdpo: one weight per reward component, in "
                                                                 "alphabetical order of the "
                                                                 "reward/<name> keys; null = all 1.")
    minus_baseline: bool = Field(True, description="grpo/reinforce_plus_plus: subtract the group baseline (false: A = "
                                                   "r before normalisation/whitening).")

    @model_validator(mode="after")
    def _check(self) -> GRPOAdvEstimatorConfig:
        if self.reward_weights is not None and self.name != "gdpo":
            raise ValueError(f"reward_weights = {self.reward_weights} with name = {self.name!r}: weights apply only to "
                             "gdpo; set name: gdpo or reward_weights: null")
        return self


class RewardShapingConfig(StrictModel):
    """``grpo.reward_shaping``: DAPO overlong reward shaping or the stop-properly penalty."""

    enabled: bool = Field(False, description="Apply reward shaping after reward scaling.")
    overlong_buffer_length: int | None = Field(128, description="DAPO: length of the soft-punishment zone before "
                                                                "max_response_length, in tokens.")
    overlong_buffer_penalty: float | None = Field(1.0, description="DAPO: penalty reached at max_response_length.")
    max_response_length: int | None = Field(None, description="DAPO: the response length budget in tokens (NeMo RL "
                                                              "defaults it to policy.max_total_sequence_length).")
    stop_properly_penalty_coef: float | None = Field(None, description="In [0, 1]: multiply the reward of truncated "
                                                                       "samples by this; when set the "
                                                                       "overlong parameters are ignored.")

    @model_validator(mode="after")
    def _check(self) -> RewardShapingConfig:
        errors: list[str] = []
        coef = self.stop_properly_penalty_coef
        if coef is not None and not 0.0 <= coef <= 1.0:
            errors.append(f"stop_properly_penalty_coef = {coef}: needs a value in [0, 1] (0 zeroes truncated rewards)")
        if self.enabled and coef is None:
            missing = [k for k in ("overlong_buffer_length", "overlong_buffer_penalty",
                                   "max_response_length") if getattr(self, k) is None]
            if missing:
                errors.append(f"enabled = true needs {', '.join(missing)} (DAPO overlong shaping) or "
                              "stop_properly_penalty_coef; set them")
            buf, max_len = self.overlong_buffer_length, self.max_response_length
            if buf is not None and buf <= 0:
                errors.append(f"overlong_buffer_length = {buf}: needs a positive number of tokens (128 is usual)")
            if buf is not None and max_len is not None and buf > max_len:
                errors.append(f"overlong_buffer_length = {buf} > max_response_length "
                              f"= {max_len}: the buffer must fit in the response budget")
        if errors:
            raise ValueError("\n".join(errors))
        return self


class RewardScalingConfig(StrictModel):
    """``grpo.reward_scaling``: clamp rewards to [source_min, source_max] and map linearly to
    [target_min, target_max]."""

    enabled: bool = Field(False, description="Apply the linear reward map (before reward shaping).")
    source_min: float = Field(0.0, description="Lower end of the raw reward range (rewards below are clamped).")
    source_max: float = Field(1.0, description="Upper end of the raw reward range (rewards above are clamped).")
    target_min: float = Field(0.0, description="Value source_min maps to.")
    target_max: float = Field(1.0, description="Value source_max maps to.")

    @model_validator(mode="after")
    def _check(self) -> RewardScalingConfig:
        if self.source_max <= self.source_min:
            raise ValueError(f"source_max = {self.source_max} <= source_min = {self.source_min}: the source range must "
                             "be non-empty; set source_max above source_min")
        return self


class PPOAdvEstimatorConfig(StrictModel):
    """``ppo.adv_estimator``: GAE with a value model, or the raw reward."""

    name: Literal["gae", "raw_reward"] = Field("gae", description="gae (needs the value model) or "
                                                                  "raw_reward (A = r on every token).")
    gae_lambda: float = Field(0.95, description="λ of GAE for both advantages and returns unless overridden below.")
    gae_gamma: float = Field(1.0, description="Discount γ per token.")
    normalize_advantages: bool = Field(True, description="Whiten advantages over the valid tokens (unbiased variance, "
                                                         "+1e-8; raw_reward uses the biased masked "
                                                         "variance clamped at 1e-8, as NeMo RL).")
    gae_lambda_value: float | None = Field(None, description="VAPO: λ for the value targets "
                                                             "(returns); null = gae_lambda.")
    gae_lambda_policy: float | None = Field(None, description="VAPO: λ for the policy advantages; null = gae_lambda.")
    length_adaptive_alpha: float = Field(0.0, description="VAPO length-adaptive λ_policy = 1 − 1/(α·L) per sample when "
                                                          "> 0 (overrides gae_lambda_policy).")

    @model_validator(mode="after")
    def _check(self) -> PPOAdvEstimatorConfig:
        errors: list[str] = []
        for key in ("gae_lambda", "gae_gamma", "gae_lambda_value", "gae_lambda_policy"):
            value = getattr(self, key)
            if value is not None and not 0.0 <= value <= 1.0:
                errors.append(f"{key} = {value}: needs a value in [0, 1]")
        if self.length_adaptive_alpha < 0:
            errors.append(f"length_adaptive_alpha = {self.length_adaptive_alpha}: "
                          "needs α >= 0 (0 disables; VAPO uses 0.05)")
        if errors:
            raise ValueError("\n".join(errors))
        return self

    def gae_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :func:`rlplane.algorithms.compute_gae` (everything but ``name``)."""
        return self.model_dump(exclude={"name"})
