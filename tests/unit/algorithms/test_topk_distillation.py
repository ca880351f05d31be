"""NeMo RL's distillation loss (``DistillationLossFn`` over ``get_distillation_topk_logprobs_from_logits``): forward,
reverse and mixed KL over the teacher's top-k logits, with and without ``zero_outside_topk``, by hand.

NeMo RL's own unit cases (tests/unit/algorithms/test_loss_functions.py, ``test_distillation_loss_*``) draw their
inputs with ``torch.randn`` on CUDA under seed 42, which a CPU cannot reproduce; the cases here are small enough
to work out on paper with NeMo RL's formulas, and its edge cases (k = 1, k larger than the vocabulary, k = 0,
all-zero and ±100 logits, gradients reaching the student's logits) are checked alike.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlplane.algorithms.distillation_kl import LOG_ZERO, topk_distillation_logprobs, topk_kl_loss

LN = math.log


def close(a, b, tol=1e-6):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               atol=tol, rtol=tol)


# One token, vocabulary of 3. Student: probabilities [0.5, 0.25, 0.25] (logits their logs). Teacher's top 2: tokens
# [0, 1] with logits [ln 0.6, ln 0.2]; renormalised over the two: [0.75, 0.25].
STUDENT = torch.tensor([[[LN(0.5), LN(0.25), LN(0.25)]]], dtype=torch.float64)  # (1, 1, 3)
TEACHER = torch.tensor([[[LN(0.6), LN(0.2)]]], dtype=torch.float64)  # (1, 1, 2)
INDICES = torch.tensor([[[0, 1]]])  # (1, 1, 2)
ONE = torch.ones(1, 1)


def loss_of(kl_type, zero_outside_topk, weight=0.5, student=STUDENT):
    s, t, neg_h = topk_distillation_logprobs(student, TEACHER, INDICES, zero_outside_topk=zero_outside_topk,
                                             want_entropy=zero_outside_topk and kl_type != "forward")
    loss, _ = topk_kl_loss(s, t, ONE, torch.ones(1), 1, kl_type=kl_type, mixed_kl_weight=weight,
                           student_neg_entropy=neg_h)
    return loss


# Renormalised over the top 2 (zero_outside_topk = false), the student is [0.5, 0.25] / 0.75 = [2/3, 1/3].
# forward = Σ p_T·ln(p_T / p_S) = 0.75·ln(0.75 / (2/3)) + 0.25·ln(0.25 / (1/3)) = 0.0883373 − 0.0719205 = 0.0164168
# reverse = Σ p_S·ln(p_S / p_T) = (2/3)·ln((2/3) / 0.75) + (1/3)·ln((1/3) / 0.25) = −0.0785220 + 0.0958940 = 0.0173720
FORWARD = 0.75 * LN(0.75 / (2 / 3)) + 0.25 * LN(0.25 / (1 / 3))
REVERSE = (2 / 3) * LN((2 / 3) / 0.75) + (1 / 3) * LN((1 / 3) / 0.25)


@pytest.mark.parametrize("kl_type, weight, want", [
    ("forward", 0.5, FORWARD),
    ("reverse", 0.5, REVERSE),
    ("mixed", 0.5, 0.5 * FORWARD + 0.5 * REVERSE),  # 0.0168944
    ("mixed", 0.3, 0.3 * FORWARD + 0.7 * REVERSE),  # mixed_kl_weight weighs the forward KL
])
def test_kl_over_the_renormalised_top_k(kl_type, weight, want):
    close(loss_of(kl_type, False, weight), want)
    close(FORWARD, 0.0164168, 1e-6)
    close(REVERSE, 0.0173720, 1e-6)


# zero_outside_topk = true: the student's top-2 log-probabilities are over the whole vocabulary, [ln 0.5, ln 0.25].
# forward = 0.75·ln(0.75 / 0.5) + 0.25·ln(0.25 / 0.25) = 0.304099 (no correction for the forward KL)
# reverse over the top 2 = 0.5·ln(0.5 / 0.75) + 0.25·ln(0.25 / 0.25) = −0.202733, plus the rest of the vocabulary,
# where the teacher's log-probability is taken as −100: H_rest − (−100)·P_rest with
# H_rest = Σ_all p ln p − Σ_top2 p ln p = 0.25·ln 0.25 = −0.346574 and P_rest = 1 − 0.75 = 0.25:
# −0.346574 + 25 = 24.653426; reverse = 24.450693. mixed (0.5) = 0.5·0.304099 + 0.5·(−0.202733 + 24.653426).
ZF = 0.75 * LN(1.5)
ZR_TOP = 0.5 * LN(0.5 / 0.75)
REST = 0.25 * LN(0.25) - LOG_ZERO * 0.25


@pytest.mark.parametrize("kl_type, want", [
    ("forward", ZF),
    ("reverse", ZR_TOP + REST),
    ("mixed", 0.5 * ZF + 0.5 * (ZR_TOP + REST)),
])
def test_kl_with_zero_outside_topk(kl_type, want):
    close(loss_of(kl_type, True), want)
    close(ZF, 0.304099, 1e-6)
    close(ZR_TOP + REST, 24.450693, 1e-6)


def test_forward_kl_gradient_is_student_minus_teacher_on_the_top_k():
    # d/dz Σ p_T·(ln p_T − ln softmax_k(z)_i) = softmax_k(z) − p_T on the top k, 0 elsewhere:
    # [2/3 − 0.75, 1/3 − 0.25, 0]
    z = STUDENT.clone().requires_grad_(True)
    loss_of("forward", False, student=z).backward()
    close(z.grad, [[[2 / 3 - 0.75, 1 / 3 - 0.25, 0.0]]])


def test_masks_and_the_global_token_count():
    # Two rows of two tokens; token mask [[1, 1], [1, 0]], row 1 also dropped by the sample mask: only row 0's two
    # tokens count, each the forward KL above; divided by the global count N = 5 (other micro-batches hold the rest).
    s, t, _ = topk_distillation_logprobs(STUDENT.expand(2, 2, 3), TEACHER.expand(2, 2, 2), INDICES.expand(2, 2, 2),
                                         zero_outside_topk=False, want_entropy=False)
    loss, m = topk_kl_loss(s, t, torch.tensor([[1.0, 1.0], [1.0, 0.0]]), torch.tensor([1.0, 0.0]), 5,
                           kl_type="forward", mixed_kl_weight=0.5)
    close(loss, 2 * FORWARD / 5)
    close(m["num_valid_samples"], 1.0)


def test_micro_batches_sum_to_the_whole_batch():
    g = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(4, 5, 11, generator=g), torch.randn(4, 5, 3, generator=g)
    idx = torch.randint(0, 11, (4, 5, 3), generator=g)
    mask = (torch.rand(4, 5, generator=g) > 0.3).float()
    n = mask.sum()

    def part(rows):
        s, t, h = topk_distillation_logprobs(student[rows], teacher[rows], idx[rows], zero_outside_topk=True,
                                             want_entropy=True)
        return topk_kl_loss(s, t, mask[rows], torch.ones(len(rows)), n, kl_type="mixed", mixed_kl_weight=0.5,
                            student_neg_entropy=h)[0]

    close(part([0, 1, 2, 3]), part([0, 1]) + part([2, 3]), 1e-5)


@pytest.mark.parametrize("k", [1, 3, 8])  # k = 1; k = the vocabulary; k > the vocabulary (repeated indices)
@pytest.mark.parametrize("zero_outside_topk", [False, True])
def test_any_k_gives_a_finite_loss(k, zero_outside_topk):
    g = torch.Generator().manual_seed(1)
    student = torch.randn(2, 4, 3, generator=g, requires_grad=True)
    idx = torch.randint(0, 3, (2, 4, k), generator=g)
    s, t, h = topk_distillation_logprobs(student, torch.randn(2, 4, k, generator=g), idx,
                                         zero_outside_topk=zero_outside_topk, want_entropy=zero_outside_topk)
    loss, _ = topk_kl_loss(s, t, torch.ones(2, 4), torch.ones(2), 8, kl_type="forward", mixed_kl_weight=0.5,
                           student_neg_entropy=h)
    loss.backward()
    assert torch.isfinite(loss)
    if k == 1 and not zero_outside_topk:  # one token renormalised is certain on both sides: no divergence, no gradient
        close(loss, 0.0)
        close(student.grad, torch.zeros_like(student))
    else:
        assert student.grad.abs().sum() > 0


@pytest.mark.parametrize("value", [0.0, 100.0, -100.0])
def test_extreme_student_logits_stay_finite(value):
    s, t, h = topk_distillation_logprobs(torch.full((1, 2, 3), value), TEACHER.expand(1, 2, 2).float(),
                                         INDICES.expand(1, 2, 2), zero_outside_topk=True, want_entropy=True)
    for kl in ("forward", "reverse", "mixed"):
        loss, _ = topk_kl_loss(s, t, torch.ones(1, 2), torch.ones(1), 2, kl_type=kl, mixed_kl_weight=0.5,
                               student_neg_entropy=h)
        assert torch.isfinite(loss)


def test_k_zero_is_refused():
    with pytest.raises(ValueError, match="top-k must be positive"):
        topk_distillation_logprobs(STUDENT, TEACHER[..., :0], INDICES[..., :0], zero_outside_topk=False,
                                   want_entropy=False)


@pytest.mark.parametrize("kl_type", ["forward", "reverse", "mixed"])
@pytest.mark.parametrize("zero_outside_topk", [False, True])
def test_vectorized_equals_its_loop_twin(kl_type, zero_outside_topk):
    from rlplane.algorithms._reference import topk_kl_loss_loop

    g = torch.Generator().manual_seed(3)
    student, teacher = torch.randn(3, 4, 9, generator=g, dtype=torch.float64), torch.randn(3, 4, 4, generator=g)
    idx = torch.stack([torch.randperm(9, generator=g)[:4] for _ in range(12)]).reshape(3, 4, 4)
    mask = (torch.rand(3, 4, generator=g) > 0.25).float()
    s, t, h = topk_distillation_logprobs(student, teacher, idx, zero_outside_topk=zero_outside_topk,
                                         want_entropy=zero_outside_topk)
    loss, _ = topk_kl_loss(s, t, mask, torch.ones(3), 7.0, kl_type=kl_type, mixed_kl_weight=0.3,
                           student_neg_entropy=h)
    close(loss, topk_kl_loss_loop(student, teacher, idx, mask, 7.0, kl_type, 0.3, zero_outside_topk), 1e-6)
