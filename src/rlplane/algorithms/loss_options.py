"""Options of the clipped policy-gradient loss and of the KL in the reward: frozen, checked once when made.

:class:`ClippedPGOptions` is the ``loss_fn`` config section (``config/algorithms.py`` builds its pydantic
model from these fields); every violated rule is reported at once. Names and defaults follow NeMo RL.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

#: The KL estimators :func:`rlplane.algorithms.kl.kl_estimate` knows (here, beside the options that name them).
KL_TYPES: tuple[str, ...] = ("k1", "k2", "k3")

TIS_TYPES: tuple[str, ...] = ("tis", "icepop", "seq-mask-tis")


def _opt(default, doc: str):
    return field(default=default, metadata={"doc": doc})


def _yaml(value: object) -> str:
    """A value as the user wrote it in YAML (None -> null)."""
    return "null" if value is None else str(value)


@dataclass(frozen=True)
class KLInReward:
    """``−β·KL_t(prev ‖ ref)`` added to the per-token reward (``loss_fn.use_kl_in_reward``), for REINFORCE++ and GAE."""

    beta: float  # β = loss_fn.reference_policy_kl_penalty
    kl_type: str = "k3"  # loss_fn.reference_policy_kl_type
    input_clamp_value: float | None = 20.0  # loss_fn.kl_input_clamp_value
    output_clamp_value: float | None = 10.0  # loss_fn.kl_output_clamp_value

    def __post_init__(self) -> None:
        errors = self.errors()
        if errors:
            raise ValueError("\n".join(errors))

    def errors(self) -> list[str]:
        """Every violated rule, one line each (empty list = valid)."""
        errors: list[str] = []
        if self.beta < 0:
            errors.append(f"beta = {self.beta}: needs β >= 0 (loss_fn.reference_policy_kl_penalty)")
        if self.kl_type not in KL_TYPES:
            errors.append(f"kl_type = {self.kl_type!r}: unknown estimator; use one of {', '.join(KL_TYPES)}")
        for key in ("input_clamp_value", "output_clamp_value"):
            value = getattr(self, key)
            if value is not None and value <= 0:
                errors.append(f"{key} = {value}: needs a positive bound; use a value > 0 or None for no clamp")
        return errors


@dataclass(frozen=True)
class ClippedPGOptions:
    """``loss_fn``: the clipped policy-gradient loss (PPO/GRPO/DAPO/GSPO/CISPO/REINFORCE)."""

    disable_ppo_ratio: bool = _opt(False, "Use the REINFORCE/RLOO surrogate −A·log π instead of the PPO ratio.")
    token_level_loss: bool = _opt(True, "Mean over all valid tokens of the global batch (true) or mean over sequences "
                                        "of per-sequence token means (false).")
    sequence_level_importance_ratios: bool = _opt(False, "GSPO: one ratio per sequence, exp(mean_t log(π/π_old)); "
                                                         "requires token_level_loss = false.")
    ratio_clip_min: float = _opt(0.2, "ε_low: the ratio is clamped below at 1 − ε_low.")
    ratio_clip_max: float = _opt(0.2, "ε_high: the ratio is clamped above at 1 + ε_high (DAPO clip-higher uses 0.28).")
    ratio_clip_c: float | None = _opt(None, "Dual-clip constant c > 1 bounding the loss of negative-advantage tokens "
                                            "at −c·A (3 is usual; DAPO recipes use 10); null disables.")
    reference_policy_kl_penalty: float = _opt(0.01, "β, weight of the KL(π_θ ‖ π_ref) term; 0 "
                                                    "disables it (and the reference forward).")
    reference_policy_kl_type: Literal["k1", "k2", "k3"] = _opt("k3", "KL estimator (Schulman 2020): k1 = −log r, k2 = "
                                                                     "(log r)²/2, k3 = r − 1 − log r.")
    kl_input_clamp_value: float | None = _opt(20.0, "Clamp of log(π_ref/π_θ) before the KL estimator; null for none.")
    kl_output_clamp_value: float | None = _opt(10.0, "Clamp of the per-token KL estimate; null for none.")
    use_kl_in_reward: bool = _opt(False, "REINFORCE++/GAE: subtract β·KL from the per-token reward instead of adding "
                                         "it to the loss (the loss's β is then 0).")
    use_importance_sampling_correction: bool = _opt(False, "Weight the loss by π_old/π_gen to correct the "
                                                           "generation/training mismatch; required for async GRPO.")
    truncated_importance_sampling_type: Literal["tis", "icepop", "seq-mask-tis"] | None = _opt(
        None, "Truncation of the IS weights: tis clamps, icepop zeroes tokens outside [min, max], seq-mask-tis drops "
              "sequences whose geometric-mean weight is outside [min, max].")
    truncated_importance_sampling_ratio: float | None = _opt(None, "Upper bound (> 0) of the IS weight for truncation.")
    truncated_importance_sampling_ratio_min: float | None = _opt(None, "Lower bound of the IS weight (tis: 0 when "
                                                                       "null; required for icepop and seq-mask-tis).")
    use_on_policy_kl_approximation: bool = _opt(False, "Weight the KL term by π_θ/π_gen so it "
                                                       "estimates the KL under the current policy.")
    force_on_policy_ratio: bool = _opt(False, "Skip the prev-logprob forward and use ratio exp(log π − sg(log π)) = 1; "
                                              "only valid with one optimizer step per rollout.")
    use_cispo: bool = _opt(False, "CISPO surrogate −A·sg(clamp(r))·log π: clipped "
                                  "IS weight, gradient kept on every token.")
    positive_example_nll_weight: float = _opt(0.0, "VAPO μ: weight of an NLL term on samples with reward > 0 (needs "
                                                   "rewards in the loss call).")

    def __post_init__(self) -> None:
        errors = self.errors()
        if errors:
            raise ValueError("\n".join(errors))

    @property
    def kl_beta(self) -> float:
        """β of the loss's KL term: 0 when the KL goes into the reward instead (``use_kl_in_reward``)."""
        return 0.0 if self.use_kl_in_reward else self.reference_policy_kl_penalty

    @property
    def kl_in_reward(self) -> KLInReward | None:
        """The KL-in-reward options when ``use_kl_in_reward`` is on with β ≠ 0; None otherwise."""
        if not self.use_kl_in_reward or self.reference_policy_kl_penalty == 0:
            return None
        return KLInReward(self.reference_policy_kl_penalty, self.reference_policy_kl_type, self.kl_input_clamp_value,
                          self.kl_output_clamp_value)

    def as_dict(self) -> dict:
        return asdict(self)

    def errors(self) -> list[str]:
        """Every violated rule, one line each (empty list = valid)."""
        o = self
        errors: list[str] = []
        if o.ratio_clip_min < 0 or o.ratio_clip_min >= 1:
            errors.append(f"ratio_clip_min = {o.ratio_clip_min}: needs 0 <= "
                          "ε_low < 1 (the ratio floor is 1 − ε_low); 0.2 is usual")
        if o.ratio_clip_max < 0:
            errors.append(f"ratio_clip_max = {o.ratio_clip_max}: needs ε_high "
                          ">= 0; 0.2 is usual (0.28 for DAPO clip-higher)")
        if o.ratio_clip_c is not None and o.ratio_clip_c <= 1:
            errors.append(f"ratio_clip_c = {o.ratio_clip_c}: dual-clip needs "
                          "c > 1 (3 is usual); set it above 1 or to null")
        if o.reference_policy_kl_penalty < 0:
            errors.append(f"reference_policy_kl_penalty = {o.reference_policy_kl_penalty}: "
                          "needs β >= 0; use 0 to disable the KL term")
        if o.reference_policy_kl_type not in KL_TYPES:
            errors.append(f"reference_policy_kl_type = {o.reference_policy_kl_type!r}: "
                          "unknown estimator; use one of k1, k2, k3")
        for key in ("kl_input_clamp_value", "kl_output_clamp_value"):
            value = getattr(o, key)
            if value is not None and value <= 0:
                errors.append(f"{key} = {value}: needs a positive bound; use a value > 0 or null for no clamp")
        if o.use_cispo:
            for key, bad in (("disable_ppo_ratio", True), ("force_on_policy_ratio", True),
                             ("sequence_level_importance_ratios", True), ("token_level_loss", False)):
                value = getattr(o, key)
                if value == bad:
                    errors.append(f"use_cispo = true with {key} = {str(value).lower()}: CISPO is incompatible; set "
                                  f"{key} = {str(not bad).lower()} or use_cispo = false")
            if o.ratio_clip_c is not None:
                errors.append(f"use_cispo = true with ratio_clip_c = {o.ratio_clip_c}: CISPO has no dual clip; set "
                              "ratio_clip_c = null or use_cispo = false")
        if o.sequence_level_importance_ratios and o.token_level_loss:
            errors.append("sequence_level_importance_ratios = true with token_level_loss = true: GSPO needs a "
                          "sequence-level loss; set token_level_loss = false")
        if o.force_on_policy_ratio and o.disable_ppo_ratio:
            errors.append("force_on_policy_ratio = true with disable_ppo_ratio = true: pick one; the forced ratio "
                          "needs the PPO ratio enabled")
        tis_type, tis_max, tis_min = (
            o.truncated_importance_sampling_type, o.truncated_importance_sampling_ratio,
            o.truncated_importance_sampling_ratio_min,
        )
        if tis_type is not None:
            if tis_type not in TIS_TYPES:
                errors.append(f"truncated_importance_sampling_type = {tis_type!r}: "
                              "unknown; use one of tis, icepop, seq-mask-tis or null")
            if not o.use_importance_sampling_correction:
                errors.append(f"truncated_importance_sampling_type = {tis_type!r} with "
                              "use_importance_sampling_correction = false: "
                              "truncation needs IS correction; set it to true")
            if tis_max is None or tis_max <= 0:
                errors.append(f"truncated_importance_sampling_ratio = {_yaml(tis_max)}: {tis_type!r} needs a positive "
                              "upper bound (e.g. 2 for tis, 5 for icepop)")
            if tis_type in ("icepop", "seq-mask-tis") and tis_min is None:
                errors.append(f"truncated_importance_sampling_ratio_min = null: {tis_type!r} needs a lower bound (e.g. "
                              "0.5 for icepop, 0.999 for seq-mask-tis)")
            if tis_type == "seq-mask-tis" and o.sequence_level_importance_ratios:
                errors.append("truncated_importance_sampling_type = 'seq-mask-tis' with "
                              "sequence_level_importance_ratios = true: incompatible; use 'tis' or 'icepop'")
        elif tis_max is not None or tis_min is not None:
            errors.append(f"truncated_importance_sampling_ratio = {_yaml(tis_max)}, _min = {_yaml(tis_min)} with no "
                          "type: set truncated_importance_sampling_type "
                          "(tis, icepop or seq-mask-tis) or the ratios to null")
        if tis_max is not None and tis_min is not None and tis_min > tis_max:
            errors.append(f"truncated_importance_sampling_ratio_min = {tis_min} > truncated_importance_sampling_ratio "
                          f"= {tis_max}: the lower bound must not exceed the upper")
        if tis_min is not None and tis_min < 0:
            errors.append(f"truncated_importance_sampling_ratio_min = {tis_min}: needs >= 0")
        if o.positive_example_nll_weight < 0:
            errors.append(f"positive_example_nll_weight = {o.positive_example_nll_weight}: "
                          "needs μ >= 0; 0 disables the VAPO NLL term")
        return errors


#: Distillation losses (``loss_fn.kl_type``): NeMo RL's KL over the teacher's top-k logits, or the sampled reverse KL.
DISTILLATION_KL_TYPES: tuple[str, ...] = ("forward", "reverse", "mixed", "sampled_reverse")


@dataclass(frozen=True)
class DistillationLossOptions:
    """``loss_fn`` keys of on-policy distillation (NeMo RL's ``DistillationLossFn``; ``algorithm: distillation``)."""

    kl_type: Literal["forward", "reverse", "mixed", "sampled_reverse"] = _opt(
        "mixed", "forward KL(p_T ‖ p_S), reverse KL(p_S ‖ p_T) or mixed, over the teacher's distillation.topk_logits_k "
                 "largest logits (NeMo RL); sampled_reverse: the per-token reverse KL on the sampled token only "
                 "(log π_S − log π_T of the student's own token; one optimizer step per rollout).")
    mixed_kl_weight: float = _opt(0.5, "mixed: the forward KL's weight w (the reverse KL's is 1 − w), in [0, 1].")
    zero_outside_topk: bool = _opt(False, "Take the student's probabilities over the whole vocabulary (not "
                                          "renormalised over the top k) and count its mass outside the top k in the "
                                          "reverse KL against a teacher log-probability of −100.")

    def __post_init__(self) -> None:
        errors = self.errors()
        if errors:
            raise ValueError("\n".join(errors))

    @property
    def topk(self) -> bool:
        """Whether the loss reads the teacher's top-k logits (else its logprob of the sampled token)."""
        return self.kl_type != "sampled_reverse"

    def errors(self) -> list[str]:
        errors: list[str] = []
        if self.kl_type not in DISTILLATION_KL_TYPES:
            errors.append(f"kl_type = {self.kl_type!r}: one of {', '.join(DISTILLATION_KL_TYPES)}")
        if not 0.0 <= self.mixed_kl_weight <= 1.0:
            errors.append(f"mixed_kl_weight = {self.mixed_kl_weight}: the forward KL's weight must be in [0, 1] "
                          "(0.5 is NeMo RL's)")
        if self.zero_outside_topk and self.kl_type == "sampled_reverse":
            errors.append("zero_outside_topk = true with kl_type = 'sampled_reverse': the sampled KL reads no top k; "
                          "set a top-k kl_type (forward, reverse, mixed) or zero_outside_topk = false")
        return errors
