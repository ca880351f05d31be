"""Distillation over the teacher's top-k logits (NeMo RL's ``DistillationLossFn``; Agarwal et al. 2024, GKD).

At each trained token the teacher gave its k largest logits and their token ids. With ``p_T`` the teacher's
distribution renormalised over those k tokens and ``p_S`` the student's over the same k (renormalised over them,
or with ``zero_outside_topk`` its full-vocabulary probabilities there):

    forward  = Σ_k p_T·(log p_T − log p_S)          reverse = Σ_k p_S·(log p_S − log p_T)
    mixed    = w·forward + (1 − w)·reverse          (w = mixed_kl_weight)

With ``zero_outside_topk`` the reverse part also counts the student's mass outside the top k against a teacher
log-probability of ``LOG_ZERO`` (−100): ``Σ_{v ∉ top k} p_S·(log p_S − LOG_ZERO) = H_rest − LOG_ZERO·P_rest``
(times 1 − w for mixed). The loss is ``Σ per-token KL·m / N``, ``m = token_mask·sample_mask``, N the global batch's
valid tokens. Shapes: B rows, T positions, V vocabulary, k teacher logits per position.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from rlplane.algorithms._ops import as_tensor_like, masked_sum, safe_div

LOG_ZERO = -100.0  # the teacher's log-probability of a token outside its top k (NeMo RL's log_infinitesimal)
KL_TYPES = ("forward", "reverse", "mixed")
#: How each :func:`topk_kl_loss` metric combines across micro-batches.
TOPK_KL_METRIC_REDUCTIONS: dict[str, str] = {"loss": "sum", "distillation_kl": "sum", "num_valid_samples": "sum"}


def topk_distillation_logprobs(
    student_logits: Tensor,
    teacher_topk_logits: Tensor,
    teacher_topk_indices: Tensor,
    *,
    zero_outside_topk: bool,
    want_entropy: bool,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``(student log p_S (B, T, k), teacher log p_T (B, T, k), Σ_V p·log p of the student (B, T) or None)``.

    ``student_logits`` (B, T, V) and ``teacher_topk_logits`` (B, T, k) at the same positions (temperature already
    applied), ``teacher_topk_indices`` (B, T, k) the teacher's token ids. The teacher is renormalised over its k;
    the student over the same k, or with ``zero_outside_topk`` taken from its full softmax.
    """
    if teacher_topk_indices.shape[-1] <= 0:
        raise ValueError(f"top-k must be positive, got k = {teacher_topk_indices.shape[-1]}")
    logits = student_logits.to(torch.promote_types(student_logits.dtype, torch.float32))
    idx = teacher_topk_indices.to(torch.long)
    neg_entropy = None
    if zero_outside_topk:
        full = F.log_softmax(logits, dim=-1)  # (B, T, V)
        student = full.gather(-1, idx)
        if want_entropy:
            neg_entropy = (full.exp() * full).sum(-1)  # (B, T)
    else:
        student = F.log_softmax(logits.gather(-1, idx), dim=-1)
    teacher = F.log_softmax(teacher_topk_logits.to(student.dtype), dim=-1)
    return student, teacher, neg_entropy


def topk_kl_loss(
    student_topk_logprobs: Tensor,
    teacher_topk_logprobs: Tensor,
    token_mask: Tensor,
    sample_mask: Tensor,
    global_valid_tokens: float | Tensor,
    *,
    kl_type: str,
    mixed_kl_weight: float,
    student_neg_entropy: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The token-mean KL of the module docstring. ``student_neg_entropy`` (``Σ_V p log p``, B × T): give it for
    ``zero_outside_topk`` so the reverse part counts the mass outside the top k (ignored for ``forward``)."""
    if kl_type not in KL_TYPES:
        raise ValueError(f"kl_type = {kl_type!r}: one of {', '.join(KL_TYPES)}")
    s, t = student_topk_logprobs, teacher_topk_logprobs.to(student_topk_logprobs.dtype)
    p_s, p_t = s.exp(), t.exp()
    forward = (p_t * (t - s)).sum(-1)  # (B, T)
    reverse = (p_s * (s - t)).sum(-1)
    if student_neg_entropy is not None and kl_type != "forward":
        rest = (student_neg_entropy - (p_s * s).sum(-1)) - LOG_ZERO * (1.0 - p_s.sum(-1))  # H_rest − LOG_ZERO·P_rest
        reverse = reverse + rest
    w = mixed_kl_weight
    per_token = {"forward": forward, "reverse": reverse, "mixed": w * forward + (1.0 - w) * reverse}[kl_type]
    m = token_mask.to(per_token.dtype) * sample_mask.to(per_token.dtype)[:, None]  # (B, T)
    loss = safe_div(masked_sum(per_token, m), as_tensor_like(global_valid_tokens, m))
    metrics = {"loss": loss.detach(), "distillation_kl": loss.detach(),
               "num_valid_samples": sample_mask.to(per_token.dtype).sum()}
    return loss, metrics
