"""Policy, value and supervised losses, each returning ``(loss, metrics)``.

All tensors are per token and already aligned: ``logprobs[:, t] = log π(token_t | tokens_<t)``
(the trainer does the shift). Shape legend: B = sequences in the micro-batch, T = tokens.

**Normalisation.** Every loss and every summable metric is divided by a count over the *whole
global batch* (``global_valid_tokens`` = Σ token_mask·sample_mask, ``global_valid_seqs`` =
Σ sample_mask, both summed over micro-batches and DP ranks), so summing the values returned for
the micro-batches of a global batch gives the global-batch mean (NeMo RL's
``docs/design-docs/loss-functions.md``). :data:`CLIPPED_PG_METRIC_REDUCTIONS` (and its twins)
say how each metric combines across micro-batches: ``sum``, ``min`` or ``max``.
``docs/algorithms.md`` lists every formula.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rlplane.algorithms._ops import as_tensor_like, masked_mean, masked_sum, safe_div
from rlplane.algorithms.kl import KL_TYPES, kl_estimate

TIS_TYPES: tuple[str, ...] = ("tis", "icepop", "seq-mask-tis")

#: How each clipped-PG metric combines across micro-batches (and DP ranks) of one global batch.
CLIPPED_PG_METRIC_REDUCTIONS: dict[str, str] = {
    "loss": "sum",
    "actor_loss": "sum",
    "kl_penalty": "sum",
    "probs_ratio": "sum",
    "probs_ratio_clamped": "sum",
    "probs_ratio_min": "min",
    "probs_ratio_max": "max",
    "probs_ratio_clamped_min": "min",
    "probs_ratio_clamped_max": "max",
    "clip_fraction": "sum",
    "clip_fraction_low": "sum",
    "clip_fraction_high": "sum",
    "dual_clip_fraction": "sum",
    "token_mult_prob_error": "sum",
    "gen_kl_error": "sum",
    "policy_kl_error": "sum",
    "js_divergence_error": "sum",
    "sampling_importance_ratio": "sum",
    "is_oob_ratio": "sum",
    "approx_entropy": "sum",
    "positive_nll_loss": "sum",
    "num_valid_samples": "sum",
}

#: How each :func:`value_loss` metric combines across micro-batches.
VALUE_METRIC_REDUCTIONS: dict[str, str] = {
    "loss": "sum",
    "vf_clipfrac": "sum",
    "returns_mean": "sum",
    "returns_sq_mean": "sum",
    "values_mean": "sum",
    "residual_sq_mean": "sum",
    "values_min": "min",
    "values_max": "max",
    "num_valid_samples": "sum",
}

#: How each :func:`nll_loss` metric combines across micro-batches.
NLL_METRIC_REDUCTIONS: dict[str, str] = {"loss": "sum", "num_unmasked_tokens": "sum", "num_valid_samples": "sum"}


def _yaml(value: object) -> str:
    """A value as the user wrote it in YAML (None -> null)."""
    return "null" if value is None else str(value)


def loss_option_errors(
    *,
    ratio_clip_min: float = 0.2,
    ratio_clip_max: float = 0.2,
    ratio_clip_c: float | None = None,
    reference_policy_kl_penalty: float = 0.01,
    reference_policy_kl_type: str = "k3",
    kl_input_clamp_value: float | None = 20.0,
    kl_output_clamp_value: float | None = 10.0,
    use_kl_in_reward: bool = False,
    use_importance_sampling_correction: bool = False,
    truncated_importance_sampling_type: str | None = None,
    truncated_importance_sampling_ratio: float | None = None,
    truncated_importance_sampling_ratio_min: float | None = None,
    use_on_policy_kl_approximation: bool = False,
    force_on_policy_ratio: bool = False,
    use_cispo: bool = False,
    disable_ppo_ratio: bool = False,
    token_level_loss: bool = True,
    sequence_level_importance_ratios: bool = False,
    positive_example_nll_weight: float = 0.0,
) -> list[str]:
    """Every violated rule among the ``loss_fn.*`` options, one line each (empty list = valid).

    Shared by :class:`rlplane.config.algorithms.LossConfig` and :func:`clipped_pg_loss`, so the
    config and the kernel can never disagree on what is allowed.
    """
    errors: list[str] = []
    if ratio_clip_min < 0 or ratio_clip_min >= 1:
        errors.append(f"ratio_clip_min = {ratio_clip_min}: needs 0 <= ε_low < 1 (the ratio floor is 1 − ε_low); 0.2 is usual")
    if ratio_clip_max < 0:
        errors.append(f"ratio_clip_max = {ratio_clip_max}: needs ε_high >= 0; 0.2 is usual (0.28 for DAPO clip-higher)")
    if ratio_clip_c is not None and ratio_clip_c <= 1:
        errors.append(f"ratio_clip_c = {ratio_clip_c}: dual-clip needs c > 1 (3 is usual); set it above 1 or to null")
    if reference_policy_kl_penalty < 0:
        errors.append(f"reference_policy_kl_penalty = {reference_policy_kl_penalty}: needs β >= 0; use 0 to disable the KL term")
    if reference_policy_kl_type not in KL_TYPES:
        errors.append(f"reference_policy_kl_type = {reference_policy_kl_type!r}: unknown estimator; use one of k1, k2, k3")
    for key, value in (("kl_input_clamp_value", kl_input_clamp_value), ("kl_output_clamp_value", kl_output_clamp_value)):
        if value is not None and value <= 0:
            errors.append(f"{key} = {value}: needs a positive bound; use a value > 0 or null for no clamp")
    if use_cispo:
        for key, value, bad in (
            ("disable_ppo_ratio", disable_ppo_ratio, True),
            ("force_on_policy_ratio", force_on_policy_ratio, True),
            ("sequence_level_importance_ratios", sequence_level_importance_ratios, True),
            ("token_level_loss", token_level_loss, False),
        ):
            if value == bad:
                errors.append(f"use_cispo = true with {key} = {str(value).lower()}: CISPO is incompatible; set {key} = {str(not bad).lower()} or use_cispo = false")
        if ratio_clip_c is not None:
            errors.append(f"use_cispo = true with ratio_clip_c = {ratio_clip_c}: CISPO has no dual clip; set ratio_clip_c = null or use_cispo = false")
    if sequence_level_importance_ratios and token_level_loss:
        errors.append("sequence_level_importance_ratios = true with token_level_loss = true: GSPO needs a sequence-level loss; set token_level_loss = false")
    if force_on_policy_ratio and disable_ppo_ratio:
        errors.append("force_on_policy_ratio = true with disable_ppo_ratio = true: pick one; the forced ratio needs the PPO ratio enabled")
    tis_type, tis_max, tis_min = (
        truncated_importance_sampling_type, truncated_importance_sampling_ratio, truncated_importance_sampling_ratio_min,
    )
    if tis_type is not None:
        if tis_type not in TIS_TYPES:
            errors.append(f"truncated_importance_sampling_type = {tis_type!r}: unknown; use one of tis, icepop, seq-mask-tis or null")
        if not use_importance_sampling_correction:
            errors.append(f"truncated_importance_sampling_type = {tis_type!r} with use_importance_sampling_correction = false: truncation needs IS correction; set it to true")
        if tis_max is None or tis_max <= 0:
            errors.append(f"truncated_importance_sampling_ratio = {_yaml(tis_max)}: {tis_type!r} needs a positive upper bound (e.g. 2 for tis, 5 for icepop)")
        if tis_type in ("icepop", "seq-mask-tis") and tis_min is None:
            errors.append(f"truncated_importance_sampling_ratio_min = null: {tis_type!r} needs a lower bound (e.g. 0.5 for icepop, 0.999 for seq-mask-tis)")
        if tis_type == "seq-mask-tis" and sequence_level_importance_ratios:
            errors.append("truncated_importance_sampling_type = 'seq-mask-tis' with sequence_level_importance_ratios = true: incompatible; use 'tis' or 'icepop'")
    elif tis_max is not None or tis_min is not None:
        errors.append(f"truncated_importance_sampling_ratio = {_yaml(tis_max)}, _min = {_yaml(tis_min)} with no type: set truncated_importance_sampling_type (tis, icepop or seq-mask-tis) or the ratios to null")
    if tis_max is not None and tis_min is not None and tis_min > tis_max:
        errors.append(f"truncated_importance_sampling_ratio_min = {tis_min} > truncated_importance_sampling_ratio = {tis_max}: the lower bound must not exceed the upper")
    if tis_min is not None and tis_min < 0:
        errors.append(f"truncated_importance_sampling_ratio_min = {tis_min}: needs >= 0")
    if positive_example_nll_weight < 0:
        errors.append(f"positive_example_nll_weight = {positive_example_nll_weight}: needs μ >= 0; 0 disables the VAPO NLL term")
    return errors


def _extrema(x: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """(min, max) of ``x`` over ``valid`` positions; (+inf, −inf) when there are none."""
    inf = torch.tensor(float("inf"), dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return inf, -inf
    return torch.where(valid, x, inf).amin(), torch.where(valid, x, -inf).amax()


def _reduce(
    per_token: Tensor, mask: Tensor, token_mask: Tensor, sample_mask: Tensor, token_level: bool,
    global_valid_tokens: Tensor, global_valid_seqs: Tensor,
) -> Tensor:
    """Aggregate a (B, T) per-token term into this micro-batch's share of the global mean.

    token level: ``Σ_{b,t} x·mask / global_valid_tokens``;
    sequence level: ``Σ_b sample_mask_b · (Σ_t x·token_mask / Σ_t token_mask) / global_valid_seqs``.
    """
    if token_level:
        return safe_div(masked_sum(per_token, mask), global_valid_tokens)
    per_seq = masked_mean(per_token, token_mask, dim=-1)  # (B,)
    return safe_div(masked_sum(per_seq, sample_mask), global_valid_seqs)


def clipped_pg_loss(
    *,
    curr_logprobs: Tensor,
    advantages: Tensor,
    token_mask: Tensor,
    sample_mask: Tensor,
    global_valid_tokens: float | Tensor,
    global_valid_seqs: float | Tensor,
    prev_logprobs: Tensor | None = None,
    generation_logprobs: Tensor | None = None,
    reference_logprobs: Tensor | None = None,
    curr_logprobs_unfiltered: Tensor | None = None,
    rewards: Tensor | None = None,
    global_valid_positive_tokens: float | Tensor | None = None,
    ratio_clip_min: float = 0.2,
    ratio_clip_max: float = 0.2,
    ratio_clip_c: float | None = None,
    reference_policy_kl_penalty: float = 0.01,
    reference_policy_kl_type: str = "k3",
    kl_input_clamp_value: float | None = 20.0,
    kl_output_clamp_value: float | None = 10.0,
    use_kl_in_reward: bool = False,
    use_importance_sampling_correction: bool = False,
    truncated_importance_sampling_type: str | None = None,
    truncated_importance_sampling_ratio: float | None = None,
    truncated_importance_sampling_ratio_min: float | None = None,
    use_on_policy_kl_approximation: bool = False,
    force_on_policy_ratio: bool = False,
    use_cispo: bool = False,
    disable_ppo_ratio: bool = False,
    token_level_loss: bool = True,
    sequence_level_importance_ratios: bool = False,
    positive_example_nll_weight: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The clipped policy-gradient loss family (PPO / GRPO / DAPO / GSPO / CISPO / REINFORCE).

    Option keywords are exactly the ``loss_fn.*`` config keys (``**LossConfig.model_dump()``).

    With ``m = token_mask·sample_mask`` (tokens whose ``curr_logprobs`` is ±inf/NaN are dropped
    from the mask; every input is zeroed outside it, so padding may hold -inf or NaN):

    - ratio ``r``: ``exp(curr − curr.detach())`` (= 1 with gradient) if ``force_on_policy_ratio``;
      else ``exp(curr − prev)``, or for GSPO (``sequence_level_importance_ratios``)
      ``exp(mean_t(curr − prev))`` per sequence; ``r_c = clamp(r, 1 − ε_low, 1 + ε_high)``.
      With ``disable_ppo_ratio``: ``r = r_c = curr`` (REINFORCE: loss = −A·log π).
    - surrogate: ``max(−A·r, −A·r_c)`` (PPO, Schulman 2017); CISPO: ``−A·sg(r_c)·curr``
      (MiniMax-M1 2025); dual clip (Ye et al. 2019): where A < 0, ``min(·, −A·c)``.
    - behaviour IS weights ``w = exp(prev − gen)`` per token (per sequence ``exp(Σ_t (prev − gen)·m)``
      for GSPO), nan/inf → 0, no gradient; ``tis``: clamp to [min (0), max]; ``icepop``: 0 outside
      [min, max]; ``seq-mask-tis``: keep a sequence iff ``min ≤ exp(mean_t(prev − gen)) ≤ max``.
      Used only if ``use_importance_sampling_correction``.
    - actor loss: ``Σ w·surrogate·m / global_valid_tokens`` (token level), or
      ``Σ_b sample_mask_b · mean_t(w·surrogate) / global_valid_seqs`` (sequence level).
    - KL to the reference (β = ``reference_policy_kl_penalty``, forced to 0 by ``use_kl_in_reward``):
      ``β·clamp(w_kl·k(clamp(ref − curr, ±in)), ±out)`` with ``w_kl = exp(curr − gen)``
      (``use_on_policy_kl_approximation``) or ``exp(curr − sg(curr))`` (= 1, keeps the
      score-function gradient, arXiv:2506.09477); reduced like the actor loss. The KL uses
      ``curr_logprobs_unfiltered`` when given (top-k/top-p training-time filtering).
    - VAPO positive NLL (``positive_example_nll_weight = μ > 0``, needs ``rewards``):
      ``μ·Σ −curr·m·[reward > 0] / N⁺``, N⁺ = ``global_valid_positive_tokens`` when given (then
      micro-batch invariant), else this micro-batch's count (NeMo RL's behaviour).

    Args:
        curr_logprobs: (B, T) log π_θ of the taken tokens, with gradient.
        advantages: (B, T) or (B,) (broadcast over tokens).
        token_mask: (B, T) 1 on trained (response) tokens.
        sample_mask: (B,) per-sequence weight (0 drops a sequence).
        global_valid_tokens, global_valid_seqs: counts over the whole global batch (all
            micro-batches, all DP ranks). 0 gives a 0 loss, never NaN.
        prev_logprobs: (B, T) log π_old from before the update; may be None only with
            ``force_on_policy_ratio`` (then ``curr.detach()``).
        generation_logprobs: (B, T) log π of the generation backend; None = ``prev``.
        reference_logprobs: (B, T); required when β ≠ 0.
        rewards: (B,), only for the VAPO NLL term.

    Returns:
        ``(loss, metrics)``: the micro-batch's share of the global loss (0-d, with gradient), and
        detached 0-d metric tensors, combined across micro-batches as in
        :data:`CLIPPED_PG_METRIC_REDUCTIONS`.
    """
    errors = loss_option_errors(
        ratio_clip_min=ratio_clip_min, ratio_clip_max=ratio_clip_max, ratio_clip_c=ratio_clip_c,
        reference_policy_kl_penalty=reference_policy_kl_penalty, reference_policy_kl_type=reference_policy_kl_type,
        kl_input_clamp_value=kl_input_clamp_value, kl_output_clamp_value=kl_output_clamp_value,
        use_kl_in_reward=use_kl_in_reward, use_importance_sampling_correction=use_importance_sampling_correction,
        truncated_importance_sampling_type=truncated_importance_sampling_type,
        truncated_importance_sampling_ratio=truncated_importance_sampling_ratio,
        truncated_importance_sampling_ratio_min=truncated_importance_sampling_ratio_min,
        use_on_policy_kl_approximation=use_on_policy_kl_approximation, force_on_policy_ratio=force_on_policy_ratio,
        use_cispo=use_cispo, disable_ppo_ratio=disable_ppo_ratio, token_level_loss=token_level_loss,
        sequence_level_importance_ratios=sequence_level_importance_ratios,
        positive_example_nll_weight=positive_example_nll_weight,
    )
    if errors:
        raise ValueError("invalid loss_fn options: " + "; ".join(errors))
    beta = 0.0 if use_kl_in_reward else reference_policy_kl_penalty
    if prev_logprobs is None and not force_on_policy_ratio:
        raise ValueError("clipped_pg_loss needs prev_logprobs unless force_on_policy_ratio = true")
    if reference_logprobs is None and beta != 0:
        raise ValueError("clipped_pg_loss needs reference_logprobs when reference_policy_kl_penalty != 0")

    # ---- masks: m = token_mask·sample_mask; non-finite curr logprobs (top-k/p mismatches) dropped
    dtype = torch.promote_types(curr_logprobs.dtype, torch.float32)
    sm = sample_mask.to(dtype)  # (B,)
    finite = torch.isfinite(curr_logprobs)
    tm = torch.where(finite, token_mask.to(dtype), torch.zeros((), dtype=dtype, device=curr_logprobs.device))  # (B, T)
    m = tm * sm[:, None]  # (B, T)
    valid = m != 0  # (B, T)
    n_tok = as_tensor_like(global_valid_tokens, m)
    n_seq = as_tensor_like(global_valid_seqs, m)

    def clean(x: Tensor) -> Tensor:  # zero every position outside the mask (padding may be -inf/NaN)
        x = x.to(dtype)
        return torch.where(valid, x, torch.zeros_like(x))

    curr = clean(curr_logprobs)
    # force_on_policy_ratio skips the prev-logprob forward: π_old = π_θ (any prev passed is ignored).
    prev = curr.detach() if force_on_policy_ratio else clean(prev_logprobs)  # type: ignore[arg-type]
    gen = prev if generation_logprobs is None else clean(generation_logprobs)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    adv = clean(adv.expand(curr.shape))

    def reduce(x: Tensor) -> Tensor:
        return _reduce(x, m, tm, sm, token_level_loss, n_tok, n_seq)

    def token_mean(x: Tensor) -> Tensor:
        return safe_div(masked_sum(x, m), n_tok)

    # ---- ratio
    ppo_ratio = not disable_ppo_ratio and not force_on_policy_ratio
    if force_on_policy_ratio:
        ratio = torch.exp(curr - curr.detach())
        ratio_c = ratio
    elif not disable_ppo_ratio:
        log_ratio = curr - prev
        if sequence_level_importance_ratios:  # GSPO: geometric mean over the sequence's tokens
            ratio = torch.exp(masked_mean(log_ratio, tm, dim=-1))[:, None].expand(curr.shape)
        else:
            ratio = torch.exp(log_ratio)
        ratio_c = ratio.clamp(1.0 - ratio_clip_min, 1.0 + ratio_clip_max)
    else:
        ratio = curr
        ratio_c = curr

    # ---- surrogate
    if use_cispo:
        surrogate = -adv * ratio_c.detach() * curr
    else:
        surrogate = torch.maximum(-adv * ratio, -adv * ratio_c)
    if ratio_clip_c is not None:
        surrogate = torch.where(adv < 0, torch.minimum(surrogate, -adv * ratio_clip_c), surrogate)

    # ---- behaviour-policy importance weights (π_old / π_gen), never differentiated
    metrics: dict[str, Tensor] = {}
    with torch.no_grad():
        if sequence_level_importance_ratios:
            is_w = torch.exp(masked_sum(prev - gen, m, dim=-1))[:, None]  # (B, 1)
        else:
            is_w = torch.exp(prev - gen)  # (B, T)
        is_w = torch.nan_to_num(is_w, nan=0.0, posinf=0.0, neginf=0.0)
        tis_max, tis_min = truncated_importance_sampling_ratio, truncated_importance_sampling_ratio_min
        if truncated_importance_sampling_type == "tis":
            lo = 0.0 if tis_min is None else tis_min
            oob = (is_w > tis_max) | (is_w < lo)
            metrics["is_oob_ratio"] = token_mean(oob.expand(curr.shape).to(dtype))
            is_w = is_w.clamp(lo, tis_max)
        elif truncated_importance_sampling_type == "icepop":
            keep = (is_w >= tis_min) & (is_w <= tis_max)
            metrics["is_oob_ratio"] = token_mean((~keep).expand(curr.shape).to(dtype))
            is_w = torch.where(keep, is_w, torch.zeros_like(is_w))
        elif truncated_importance_sampling_type == "seq-mask-tis":
            geo = torch.exp(masked_mean(torch.nan_to_num(prev - gen, nan=0.0, posinf=0.0, neginf=0.0), tm, dim=-1))
            keep_seq = ((geo >= tis_min) & (geo <= tis_max)).to(dtype)  # (B,)
            metrics["is_oob_ratio"] = safe_div(masked_sum(1.0 - keep_seq, sm), n_seq)
            is_w = is_w * keep_seq[:, None]
        is_w = is_w.expand(curr.shape)
    weighted = surrogate * is_w if use_importance_sampling_correction else surrogate
    actor_loss = reduce(weighted)

    # ---- KL to the reference policy
    if beta != 0:
        cu = curr if curr_logprobs_unfiltered is None else clean(curr_logprobs_unfiltered)
        kl_w = torch.exp(cu - gen) if use_on_policy_kl_approximation else torch.exp(cu - cu.detach())
        kl_w = torch.nan_to_num(kl_w, nan=0.0, posinf=0.0, neginf=0.0)
        kl_tok = kl_estimate(
            cu, clean(reference_logprobs), reference_policy_kl_type,  # type: ignore[arg-type]
            kl_input_clamp_value, kl_output_clamp_value, importance_weights=kl_w,
        )
        kl_term = reduce(kl_tok)
        loss = actor_loss + beta * kl_term
        metrics["kl_penalty"] = kl_term.detach()
    else:
        loss = actor_loss
        metrics["kl_penalty"] = torch.zeros((), dtype=dtype, device=curr.device)

    # ---- VAPO positive-example NLL
    if positive_example_nll_weight > 0:
        if rewards is None:
            raise ValueError("positive_example_nll_weight > 0 needs rewards (B,) passed to clipped_pg_loss")
        pos_m = m * (rewards > 0).to(dtype)[:, None]
        n_pos = pos_m.sum() if global_valid_positive_tokens is None else as_tensor_like(global_valid_positive_tokens, m)
        nll = safe_div(masked_sum(-curr, pos_m), n_pos)
        loss = loss + positive_example_nll_weight * nll
        metrics["positive_nll_loss"] = nll.detach()

    # ---- diagnostics (no gradient)
    with torch.no_grad():
        metrics["loss"] = loss.detach()
        metrics["actor_loss"] = actor_loss.detach()
        r, rc = ratio.detach(), ratio_c.detach()
        metrics["probs_ratio"] = token_mean(r)
        metrics["probs_ratio_clamped"] = token_mean(rc)
        metrics["probs_ratio_min"], metrics["probs_ratio_max"] = _extrema(r, valid)
        metrics["probs_ratio_clamped_min"], metrics["probs_ratio_clamped_max"] = _extrema(rc, valid)
        zero = torch.zeros((), dtype=dtype, device=curr.device)
        if ppo_ratio:
            below, above = r < 1.0 - ratio_clip_min, r > 1.0 + ratio_clip_max
            if not use_cispo:  # the clip only cuts the gradient on the side the advantage pushes
                below, above = below & (adv < 0), above & (adv > 0)
            low, high = token_mean(below.to(dtype)), token_mean(above.to(dtype))
            metrics["clip_fraction_low"], metrics["clip_fraction_high"] = low, high
            metrics["clip_fraction"] = low + high
        else:
            metrics["clip_fraction_low"] = metrics["clip_fraction_high"] = metrics["clip_fraction"] = zero
        if ratio_clip_c is not None and not disable_ppo_ratio:
            metrics["dual_clip_fraction"] = token_mean(((adv < 0) & (r > ratio_clip_c)).to(dtype))
        else:
            metrics["dual_clip_fraction"] = zero
        p, g = prev, gen
        metrics["token_mult_prob_error"] = token_mean(torch.exp((g - p).abs()))
        metrics["gen_kl_error"] = token_mean(kl_estimate(g, p, reference_policy_kl_type))
        metrics["policy_kl_error"] = token_mean(kl_estimate(p, g, reference_policy_kl_type))
        log_mix = torch.logaddexp(p, g) - math.log(2.0)  # log ½(p_prev + p_gen)
        js = 0.5 * (torch.expm1(p - log_mix) - (p - log_mix)) + 0.5 * (torch.expm1(g - log_mix) - (g - log_mix))
        metrics["js_divergence_error"] = token_mean(js)
        if sequence_level_importance_ratios:
            metrics["sampling_importance_ratio"] = safe_div(masked_sum(is_w[:, 0], sm), n_seq)
        else:
            metrics["sampling_importance_ratio"] = token_mean(is_w)
        metrics["approx_entropy"] = -token_mean(torch.exp(curr.detach() - gen) * curr.detach())
        metrics["num_valid_samples"] = sm.sum()
    return loss, metrics


def nll_loss(
    logprobs: Tensor,
    token_mask: Tensor,
    global_valid_tokens: float | Tensor,
    sample_mask: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Token-mean negative log-likelihood for supervised warm-up (SFT).

    ``loss = −Σ_{b,t} logprob·m / global_valid_tokens`` with ``m = token_mask·sample_mask``;
    positions outside ``m`` may hold -inf/NaN. Metrics (all sums): ``loss``,
    ``num_unmasked_tokens = Σ m``, ``num_valid_samples = Σ sample_mask``.

    Shapes: logprobs, token_mask (B, T); sample_mask (B,) or None (all 1).
    """
    dtype = torch.promote_types(logprobs.dtype, torch.float32)
    sm = torch.ones(logprobs.shape[0], dtype=dtype, device=logprobs.device) if sample_mask is None else sample_mask.to(dtype)
    m = token_mask.to(dtype) * sm[:, None]
    loss = safe_div(masked_sum(-logprobs.to(dtype), m), as_tensor_like(global_valid_tokens, m))
    metrics = {"loss": loss.detach(), "num_unmasked_tokens": m.sum(), "num_valid_samples": sm.sum()}
    return loss, metrics


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    token_mask: Tensor,
    global_valid_tokens: float | Tensor,
    clip_range: float | None = None,
    *,
    sample_mask: Tensor | None = None,
    scale: float = 1.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped MSE value loss (PPO critic). ``value_loss_fn: {scale, cliprange}`` in NeMo RL.

    With ``m = token_mask·sample_mask`` and N = ``global_valid_tokens``:
    ``L = 0.5·scale·Σ (v − R)²·m / N``, or with ``clip_range = ε > 0``:
    ``v_clip = clamp(v, v_old − ε, v_old + ε)``, ``L = 0.5·scale·Σ max((v − R)², (v_clip − R)²)·m / N``.

    Metrics (token-normalised sums unless noted): ``vf_clipfrac = Σ [(v_clip − R)² > (v − R)²]·m / N``,
    ``returns_mean``, ``returns_sq_mean``, ``values_mean``, ``residual_sq_mean = Σ (R − v)²·m / N``,
    ``values_min/max`` (min/max), ``num_valid_samples``. Explained variance is not summable across
    micro-batches: compute it from the summed metrics with :func:`explained_variance`.

    Shapes: values, old_values, returns, token_mask (B, T) (values already right-shifted so that
    position t holds V(s_t)); sample_mask (B,) or None.
    """
    dtype = torch.promote_types(values.dtype, torch.float32)
    sm = torch.ones(values.shape[0], dtype=dtype, device=values.device) if sample_mask is None else sample_mask.to(dtype)
    m = token_mask.to(dtype) * sm[:, None]
    valid = m != 0
    n_tok = as_tensor_like(global_valid_tokens, m)

    def clean(x: Tensor) -> Tensor:
        return torch.where(valid, x.to(dtype), torch.zeros((), dtype=dtype, device=x.device))

    v, v_old, ret = clean(values), clean(old_values), clean(returns)
    sq = (v - ret).square()
    if clip_range is not None and clip_range > 0:
        v_clip = torch.clamp(v, v_old - clip_range, v_old + clip_range)
        sq_clip = (v_clip - ret).square()
        per_token = torch.maximum(sq, sq_clip)
        clipfrac = safe_div(masked_sum((sq_clip > sq).to(dtype), m), n_tok)
    else:
        per_token = sq
        clipfrac = torch.zeros((), dtype=dtype, device=values.device)
    loss = 0.5 * scale * safe_div(masked_sum(per_token, m), n_tok)
    with torch.no_grad():
        vd = v.detach()
        vmin, vmax = _extrema(vd, valid)
        metrics = {
            "loss": loss.detach(),
            "vf_clipfrac": clipfrac.detach(),
            "returns_mean": safe_div(masked_sum(ret, m), n_tok),
            "returns_sq_mean": safe_div(masked_sum(ret.square(), m), n_tok),
            "values_mean": safe_div(masked_sum(vd, m), n_tok),
            "residual_sq_mean": safe_div(masked_sum((ret - vd).square(), m), n_tok),
            "values_min": vmin,
            "values_max": vmax,
            "num_valid_samples": sm.sum(),
        }
    return loss, metrics


def explained_variance(
    returns_mean: Tensor | float, values_mean: Tensor | float, returns_sq_mean: Tensor | float,
    residual_sq_mean: Tensor | float,
) -> Tensor:
    """Critic explained variance from (summed) :func:`value_loss` metrics.

    ``EV = 1 − Var(R − V) / Var(R) = 1 − (E[(R − V)²] − (μ_R − μ_V)²) / max(E[R²] − μ_R², 1e-8)``.
    1 is a perfect critic, 0 predicts no better than a constant, < 0 is worse.
    """
    mu_r, mu_v = torch.as_tensor(returns_mean, dtype=torch.float64), torch.as_tensor(values_mean, dtype=torch.float64)
    var_resid = torch.as_tensor(residual_sq_mean, dtype=torch.float64) - (mu_r - mu_v).square()
    var_r = torch.clamp(torch.as_tensor(returns_sq_mean, dtype=torch.float64) - mu_r.square(), min=1e-8)
    return 1.0 - var_resid / var_r
