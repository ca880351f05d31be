"""Policy, value and supervised losses, each returning ``(loss, metrics)``; formulas in ``docs/algorithms.md``.

Inputs are per token and aligned (``logprobs[:, t] = log π(token_t | tokens_<t)``); B sequences, T tokens.
Losses and summable metrics divide by global-batch counts (``global_valid_tokens``, ``global_valid_seqs``
over all micro-batches and DP ranks), so the micro-batch values sum to the global mean;
:data:`CLIPPED_PG_METRIC_REDUCTIONS` and its twins say how each metric combines (sum, min, max).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from rlplane.algorithms._ops import as_tensor_like, masked_extrema, masked_mean, masked_sum, safe_div
from rlplane.algorithms.advantages import opd_advantages
from rlplane.algorithms.filters import seq_mult_prob_error
from rlplane.algorithms.kl import kl_estimate
from rlplane.algorithms.loss_options import ClippedPGOptions

DEFAULT_PG_OPTIONS = ClippedPGOptions()

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
    "mean_seq_mult_prob_error": "sum",
    "min_seq_mult_prob_error": "min",
    "max_seq_mult_prob_error": "max",
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


def _reduce(
    per_token: Tensor, mask: Tensor, token_mask: Tensor, sample_mask: Tensor, token_level: bool,
    global_valid_tokens: Tensor, global_valid_seqs: Tensor,
) -> Tensor:
    """This micro-batch's share of the global mean of a (B, T) term.

    token: ``Σ x·mask / global_valid_tokens``; sequence: ``Σ_b s_b·(Σ_t x·m / Σ_t m) / global_valid_seqs``.
    """
    if token_level:
        return safe_div(masked_sum(per_token, mask), global_valid_tokens)
    per_seq = masked_mean(per_token, token_mask, dim=-1)  # (B,)
    return safe_div(masked_sum(per_seq, sample_mask), global_valid_seqs)


class _Masked(NamedTuple):
    """The loss inputs on one mask: ``m = token_mask·sample_mask`` with non-finite ``curr`` tokens
    dropped; every tensor zeroed outside it (padding may hold -inf or NaN). (B, T) unless noted."""

    dtype: torch.dtype
    sm: Tensor  # (B,) sample mask
    tm: Tensor  # token mask, non-finite curr dropped
    m: Tensor  # tm·sm
    valid: Tensor  # m != 0
    n_tok: Tensor  # global valid tokens (0-d)
    n_seq: Tensor  # global valid sequences (0-d)
    curr: Tensor
    prev: Tensor
    gen: Tensor
    adv: Tensor

    def clean(self, x: Tensor) -> Tensor:
        x = x.to(self.dtype)
        return torch.where(self.valid, x, torch.zeros_like(x))

    def token_mean(self, x: Tensor) -> Tensor:
        return safe_div(masked_sum(x, self.m), self.n_tok)

    def reduce(self, x: Tensor, token_level: bool) -> Tensor:
        return _reduce(x, self.m, self.tm, self.sm, token_level, self.n_tok, self.n_seq)


def _mask_inputs(curr_logprobs, prev_logprobs, generation_logprobs, advantages, token_mask, sample_mask,
                 global_valid_tokens, global_valid_seqs, force_on_policy_ratio: bool) -> _Masked:
    dtype = torch.promote_types(curr_logprobs.dtype, torch.float32)
    sm = sample_mask.to(dtype)  # (B,)
    finite = torch.isfinite(curr_logprobs)  # top-k/p mismatches give -inf: drop those tokens
    tm = torch.where(finite, token_mask.to(dtype), torch.zeros((), dtype=dtype, device=curr_logprobs.device))  # (B, T)
    m = tm * sm[:, None]  # (B, T)
    valid = m != 0

    def clean(t: Tensor) -> Tensor:
        t = t.to(dtype)
        return torch.where(valid, t, torch.zeros_like(t))

    curr = clean(curr_logprobs)
    # force_on_policy_ratio: π_old = π_θ, no prev-logprob forward (prev is ignored).
    prev = curr.detach() if force_on_policy_ratio else clean(prev_logprobs)
    gen = prev if generation_logprobs is None else clean(generation_logprobs)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    return _Masked(dtype, sm, tm, m, valid, as_tensor_like(global_valid_tokens, m),
                   as_tensor_like(global_valid_seqs, m),
                   curr, prev, gen, clean(adv.expand(curr.shape)))


def _ratios(x: _Masked, o: ClippedPGOptions) -> tuple[Tensor, Tensor]:
    """``(r, r_c)``: the policy ratio and its clamp (forced to 1, GSPO per sequence, or REINFORCE's ``curr``)."""
    if o.force_on_policy_ratio:
        ratio = torch.exp(x.curr - x.curr.detach())
        return ratio, ratio
    if o.disable_ppo_ratio:
        return x.curr, x.curr
    log_ratio = x.curr - x.prev
    if o.sequence_level_importance_ratios:  # GSPO: geometric mean over the sequence's tokens
        ratio = torch.exp(masked_mean(log_ratio, x.tm, dim=-1))[:, None].expand(x.curr.shape)
    else:
        ratio = torch.exp(log_ratio)
    return ratio, ratio.clamp(1.0 - o.ratio_clip_min, 1.0 + o.ratio_clip_max)


def _surrogate(x: _Masked, ratio: Tensor, ratio_c: Tensor, o: ClippedPGOptions) -> Tensor:
    """Per-token surrogate: PPO's ``max(−A·r, −A·r_c)``, or CISPO's ``−A·sg(r_c)·curr``; dual clip on A < 0."""
    adv = x.adv
    if o.use_cispo:
        surrogate = -adv * ratio_c.detach() * x.curr
    else:
        surrogate = torch.maximum(-adv * ratio, -adv * ratio_c)
    if o.ratio_clip_c is not None:
        surrogate = torch.where(adv < 0, torch.minimum(surrogate, -adv * o.ratio_clip_c), surrogate)
    return surrogate


@torch.no_grad()
def _behaviour_is_weights(x: _Masked, o: ClippedPGOptions, metrics: dict[str, Tensor]) -> Tensor:
    """(B, T) importance weights π_old/π_gen (per sequence for GSPO), truncated as asked; adds ``is_oob_ratio``."""
    prev, gen, dtype = x.prev, x.gen, x.dtype
    if o.sequence_level_importance_ratios:
        is_w = torch.exp(masked_sum(prev - gen, x.m, dim=-1))[:, None]  # (B, 1)
    else:
        is_w = torch.exp(prev - gen)  # (B, T)
    is_w = torch.nan_to_num(is_w, nan=0.0, posinf=0.0, neginf=0.0)
    tis_max, tis_min = o.truncated_importance_sampling_ratio, o.truncated_importance_sampling_ratio_min
    if o.truncated_importance_sampling_type == "tis":
        lo = 0.0 if tis_min is None else tis_min
        oob = (is_w > tis_max) | (is_w < lo)
        metrics["is_oob_ratio"] = x.token_mean(oob.expand(x.curr.shape).to(dtype))
        is_w = is_w.clamp(lo, tis_max)
    elif o.truncated_importance_sampling_type == "icepop":
        keep = (is_w >= tis_min) & (is_w <= tis_max)
        metrics["is_oob_ratio"] = x.token_mean((~keep).expand(x.curr.shape).to(dtype))
        is_w = torch.where(keep, is_w, torch.zeros_like(is_w))
    elif o.truncated_importance_sampling_type == "seq-mask-tis":
        geo = torch.exp(masked_mean(torch.nan_to_num(prev - gen, nan=0.0, posinf=0.0, neginf=0.0), x.tm, dim=-1))
        keep_seq = ((geo >= tis_min) & (geo <= tis_max)).to(dtype)  # (B,)
        metrics["is_oob_ratio"] = safe_div(masked_sum(1.0 - keep_seq, x.sm), x.n_seq)
        is_w = is_w * keep_seq[:, None]
    return is_w.expand(x.curr.shape)


def _reference_kl(x: _Masked, o: ClippedPGOptions, reference_logprobs: Tensor,
                  curr_unfiltered: Tensor | None) -> Tensor:
    """The KL-to-reference term, reduced like the actor loss (before β)."""
    cu = x.curr if curr_unfiltered is None else x.clean(curr_unfiltered)
    kl_w = torch.exp(cu - x.gen) if o.use_on_policy_kl_approximation else torch.exp(cu - cu.detach())
    kl_w = torch.nan_to_num(kl_w, nan=0.0, posinf=0.0, neginf=0.0)
    kl_tok = kl_estimate(cu, x.clean(reference_logprobs), o.reference_policy_kl_type,
                         o.kl_input_clamp_value, o.kl_output_clamp_value, importance_weights=kl_w)
    return x.reduce(kl_tok, o.token_level_loss)


@torch.no_grad()
def _diagnostics(x: _Masked, o: ClippedPGOptions, ratio: Tensor, ratio_c: Tensor, is_w: Tensor) -> dict[str, Tensor]:
    """Ratio statistics, clip fractions and the generation/training mismatch metrics (no gradient)."""
    metrics: dict[str, Tensor] = {}
    dtype, valid, adv, tm = x.dtype, x.valid, x.adv, x.token_mean
    r, rc = ratio.detach(), ratio_c.detach()
    metrics["probs_ratio"] = tm(r)
    metrics["probs_ratio_clamped"] = tm(rc)
    metrics["probs_ratio_min"], metrics["probs_ratio_max"] = masked_extrema(r, valid)
    metrics["probs_ratio_clamped_min"], metrics["probs_ratio_clamped_max"] = masked_extrema(rc, valid)
    zero = torch.zeros((), dtype=dtype, device=x.curr.device)
    if not o.disable_ppo_ratio and not o.force_on_policy_ratio:
        below, above = r < 1.0 - o.ratio_clip_min, r > 1.0 + o.ratio_clip_max
        if not o.use_cispo:  # the clip only cuts the gradient on the side the advantage pushes
            below, above = below & (adv < 0), above & (adv > 0)
        low, high = tm(below.to(dtype)), tm(above.to(dtype))
        metrics["clip_fraction_low"], metrics["clip_fraction_high"] = low, high
        metrics["clip_fraction"] = low + high
    else:
        metrics["clip_fraction_low"] = metrics["clip_fraction_high"] = metrics["clip_fraction"] = zero
    if o.ratio_clip_c is not None and not o.disable_ppo_ratio:
        metrics["dual_clip_fraction"] = tm(((adv < 0) & (r > o.ratio_clip_c)).to(dtype))
    else:
        metrics["dual_clip_fraction"] = zero
    p, g = x.prev, x.gen
    metrics["token_mult_prob_error"] = tm(torch.exp((g - p).abs()))
    metrics["gen_kl_error"] = tm(kl_estimate(g, p, o.reference_policy_kl_type))
    metrics["policy_kl_error"] = tm(kl_estimate(p, g, o.reference_policy_kl_type))
    log_mix = torch.logaddexp(p, g) - math.log(2.0)  # log ½(p_prev + p_gen)
    js = 0.5 * (torch.expm1(p - log_mix) - (p - log_mix)) + 0.5 * (torch.expm1(g - log_mix) - (g - log_mix))
    metrics["js_divergence_error"] = tm(js)
    # Per trained sequence (NeMo RL's seq_mult_prob_error); normalised by the global valid sequences.
    seq_err, alive = seq_mult_prob_error(g, p, x.tm, x.sm), x.valid.any(dim=-1)  # (B,), (B,)
    metrics["mean_seq_mult_prob_error"] = safe_div(masked_sum(seq_err, alive.to(dtype)), x.n_seq)
    metrics["min_seq_mult_prob_error"], metrics["max_seq_mult_prob_error"] = masked_extrema(seq_err, alive)
    if o.sequence_level_importance_ratios:
        metrics["sampling_importance_ratio"] = safe_div(masked_sum(is_w[:, 0], x.sm), x.n_seq)
    else:
        metrics["sampling_importance_ratio"] = tm(is_w)
    metrics["approx_entropy"] = -tm(torch.exp(x.curr.detach() - x.gen) * x.curr.detach())
    metrics["num_valid_samples"] = x.sm.sum()
    return metrics


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
    options: ClippedPGOptions = DEFAULT_PG_OPTIONS,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The clipped policy-gradient loss family (PPO / GRPO / DAPO / GSPO / CISPO / REINFORCE).

    ``options``: the ``loss_fn.*`` keys (:class:`~rlplane.algorithms.loss_options.ClippedPGOptions`).
    ``m = token_mask·sample_mask`` without tokens whose ``curr`` is non-finite; inputs are zeroed outside it.

    - ratio ``r = exp(curr − prev)``; GSPO ``exp(mean_t(curr − prev))`` per sequence; ``force_on_policy_ratio``
      ``exp(curr − sg(curr))``; ``r_c = clamp(r, 1 − ε_low, 1 + ε_high)``; ``disable_ppo_ratio``: ``r = r_c = curr``.
    - surrogate ``max(−A·r, −A·r_c)`` (PPO); CISPO ``−A·sg(r_c)·curr``; dual clip where A < 0: ``min(·, −A·c)``.
    - behaviour IS weights ``w = exp(prev − gen)`` (GSPO: per sequence), no gradient; ``tis`` clamps to
      [min, max], ``icepop`` zeroes outside it, ``seq-mask-tis`` keeps a sequence iff its mean ratio is inside.
    - actor loss ``Σ w·surrogate·m / global_valid_tokens`` (or the sequence-level mean).
    - KL ``β·clamp(w_kl·k(clamp(ref − curr, ±in)), ±out)``, ``w_kl = exp(curr − gen)`` (on-policy approximation)
      or ``exp(curr − sg(curr))`` (arXiv:2506.09477), on ``curr_logprobs_unfiltered`` when given.
    - VAPO positive NLL ``μ·Σ −curr·m·[reward > 0] / N⁺`` (N⁺ = ``global_valid_positive_tokens`` or local).

    Shapes: logprobs and ``token_mask`` (B, T); ``advantages`` (B, T) or (B,); ``sample_mask``, ``rewards`` (B,).
    ``prev_logprobs`` may be None only with ``force_on_policy_ratio``; ``generation_logprobs`` None = prev.
    Returns the micro-batch's 0-d share of the global loss and detached 0-d metrics.
    """
    o = options
    beta = o.kl_beta
    if prev_logprobs is None and not o.force_on_policy_ratio:
        raise ValueError("clipped_pg_loss needs prev_logprobs unless force_on_policy_ratio = true")
    if reference_logprobs is None and beta != 0:
        raise ValueError("clipped_pg_loss needs reference_logprobs when reference_policy_kl_penalty != 0")

    x = _mask_inputs(curr_logprobs, prev_logprobs, generation_logprobs, advantages, token_mask, sample_mask,
                     global_valid_tokens, global_valid_seqs, o.force_on_policy_ratio)
    ratio, ratio_c = _ratios(x, o)
    surrogate = _surrogate(x, ratio, ratio_c, o)  # (B, T)
    metrics: dict[str, Tensor] = {}
    is_w = _behaviour_is_weights(x, o, metrics)  # (B, T), no gradient
    actor_loss = x.reduce(surrogate * is_w if o.use_importance_sampling_correction else surrogate, o.token_level_loss)

    loss = actor_loss
    if beta != 0:
        kl_term = _reference_kl(x, o, reference_logprobs, curr_logprobs_unfiltered)  # type: ignore[arg-type]
        loss = actor_loss + beta * kl_term
        metrics["kl_penalty"] = kl_term.detach()
    else:
        metrics["kl_penalty"] = torch.zeros((), dtype=x.dtype, device=x.curr.device)

    if o.positive_example_nll_weight > 0:  # VAPO positive-example NLL
        if rewards is None:
            raise ValueError("positive_example_nll_weight > 0 needs rewards (B,) passed to clipped_pg_loss")
        pos_m = x.m * (rewards > 0).to(x.dtype)[:, None]
        n_pos = (pos_m.sum() if global_valid_positive_tokens is None
                 else as_tensor_like(global_valid_positive_tokens, x.m))
        nll = safe_div(masked_sum(-x.curr, pos_m), n_pos)
        loss = loss + o.positive_example_nll_weight * nll
        metrics["positive_nll_loss"] = nll.detach()

    metrics["loss"] = loss.detach()
    metrics["actor_loss"] = actor_loss.detach()
    metrics.update(_diagnostics(x, o, ratio, ratio_c, is_w))
    return loss, metrics


#: How each :func:`reverse_kl_loss` metric combines across micro-batches.
REVERSE_KL_METRIC_REDUCTIONS: dict[str, str] = {"loss": "sum", "reverse_kl": "sum", "num_valid_samples": "sum"}


def reverse_kl_loss(
    curr_logprobs: Tensor,
    teacher_logprobs: Tensor,
    token_mask: Tensor,
    sample_mask: Tensor,
    global_valid_tokens: float | Tensor,
) -> tuple[Tensor, dict[str, Tensor]]:
    """On-policy distillation: sampled per-token reverse KL ``KL(π_θ ‖ π_teacher)`` on y ~ π_θ.

    ``loss = Σ m·(−A)·(1 + curr − sg(curr)) / N`` with ``A = sg(log π_T − log π_θ)``: value ``Σ m·k / N``,
    gradient ``Σ m·sg(k)·∇curr / N`` (MOPD arXiv:2601.02780 Eq. 8; GKD, Agarwal et al. 2024).
    ``m = token_mask·sample_mask``, N = ``global_valid_tokens``. Shapes (B, T); ``sample_mask`` (B,).
    """
    dtype = torch.promote_types(curr_logprobs.dtype, torch.float32)
    m = token_mask.to(dtype) * sample_mask.to(dtype)[:, None]  # (B, T)
    valid = m != 0
    zero = torch.zeros((), dtype=dtype, device=curr_logprobs.device)
    curr = torch.where(valid, curr_logprobs.to(dtype), zero)
    teacher = torch.where(valid, teacher_logprobs.to(dtype), zero)
    adv = opd_advantages(teacher, curr.detach(), m)  # (B, T) = −k, no gradient
    per_token = -adv * (1.0 + curr - curr.detach())  # value −A = k, gradient −A·∇curr
    loss = safe_div(masked_sum(per_token, m), as_tensor_like(global_valid_tokens, m))
    metrics = {"loss": loss.detach(), "reverse_kl": loss.detach(), "num_valid_samples": sample_mask.to(dtype).sum()}
    return loss, metrics


def nll_loss(
    logprobs: Tensor,
    token_mask: Tensor,
    global_valid_tokens: float | Tensor,
    sample_mask: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Token-mean NLL for supervised warm-up: ``−Σ logprob·m / global_valid_tokens``, ``m = token_mask·sample_mask``.

    Shapes: (B, T); ``sample_mask`` (B,) or None (all 1).
    """
    dtype = torch.promote_types(logprobs.dtype, torch.float32)
    sm = torch.ones(logprobs.shape[0], dtype=dtype,
                    device=logprobs.device) if sample_mask is None else sample_mask.to(dtype)
    m = token_mask.to(dtype) * sm[:, None]
    loss = safe_div(masked_sum(-logprobs.to(dtype), m), as_tensor_like(global_valid_tokens, m))
    metrics = {"loss": loss.detach(), "num_unmasked_tokens": m.sum(), "num_valid_samples": sm.sum()}
    return loss, metrics
