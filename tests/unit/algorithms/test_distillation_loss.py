"""On-policy distillation: the ``opd`` advantage and the per-token reverse-KL loss, by hand.

The first four cases are NeMo RL's ``tests/unit/algorithms/test_advantage_estimator.py`` (OPD
estimator: A = sg(log π_teacher − log π_student)·mask), with the numbers worked out.
"""

from __future__ import annotations

import torch

from rlplane.algorithms import opd_advantages, reverse_kl_loss


def close(a, b, tol=1e-6):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               atol=tol, rtol=tol)


# ---------------------------------------------------------------- the opd advantage (NeMo RL's cases)
def test_opd_teacher_above_student_gives_positive_advantage():
    # teacher log 1 = 0, student −1 on every token: A = 0 − (−1) = 1 everywhere
    adv = opd_advantages(torch.zeros(2, 4), torch.full((2, 4), -1.0), torch.ones(2, 4))
    close(adv, torch.ones(2, 4))


def test_opd_equal_logprobs_give_zero():
    lp = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
    close(opd_advantages(lp, lp, torch.ones(2, 4)), torch.zeros(2, 4))


def test_opd_mask_zeroes_positions():
    # mask [1, 1, 1, 0, 0, 0]: A = 1 on the first three tokens, 0 after
    adv = opd_advantages(torch.zeros(1, 6), torch.full((1, 6), -1.0), torch.tensor([[1.0, 1, 1, 0, 0, 0]]))
    close(adv, [[1.0, 1, 1, 0, 0, 0]])


def test_opd_gap_statistics():
    # NeMo's metrics case: gap teacher − student = 0 − (−1) = 1 on 8 tokens -> mean 1, std 0
    adv = opd_advantages(torch.zeros(2, 4), torch.full((2, 4), -1.0), torch.ones(2, 4))
    close(adv.mean(), 1.0)
    close(adv.std(), 0.0)


# ---------------------------------------------------------------- the reverse-KL loss
def test_reverse_kl_value_and_gradient():
    # curr = [[−1, −2], [−0.5, −3]], teacher = [[−0.5, −2.5], [−0.5, −1]], token mask [[1, 1], [1, 0]]
    # k = curr − teacher = [[−0.5, 0.5], [0, (masked)]]; N = 3 valid tokens
    # loss value = (−0.5 + 0.5 + 0)/3 = 0;  dL/dcurr = k/N = [[−1/6, 1/6], [0, 0]]
    curr = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], dtype=torch.float64, requires_grad=True)
    teacher = torch.tensor([[-0.5, -2.5], [-0.5, -1.0]], dtype=torch.float64)
    loss, m = reverse_kl_loss(curr, teacher, torch.tensor([[1.0, 1.0], [1.0, 0.0]]), torch.ones(2), 3)
    loss.backward()
    close(loss, 0.0)
    close(curr.grad, [[-1 / 6, 1 / 6], [0.0, 0.0]])
    close(m["reverse_kl"], 0.0)
    close(m["num_valid_samples"], 2.0)


def test_reverse_kl_sample_mask_global_count_and_padding():
    # row 1 dropped by the sample mask (its -inf padding must not leak); N = 4 (the global batch's count)
    # k row 0 = [−1 − (−3), −2 − (−2)] = [2, 0] -> loss = 2/4 = 0.5; grad row 0 = [2/4, 0]
    curr = torch.tensor([[-1.0, -2.0], [float("-inf"), -1.0]], dtype=torch.float64, requires_grad=True)
    teacher = torch.tensor([[-3.0, -2.0], [float("nan"), -1.0]], dtype=torch.float64)
    loss, m = reverse_kl_loss(curr, teacher, torch.ones(2, 2), torch.tensor([1.0, 0.0]), 4)
    loss.backward()
    close(loss, 0.5)
    close(curr.grad, [[0.5, 0.0], [0.0, 0.0]])
    close(m["num_valid_samples"], 1.0)


def test_reverse_kl_gradient_is_the_exact_kl_gradient_in_expectation():
    # One token over a 3-word vocabulary: summing the per-sample gradient over y weighted by π_θ(y)
    # must give ∇ KL(π_θ ‖ π_T) computed in closed form (autograd of Σ_y p log(p/q)).
    logits = torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64, requires_grad=True)
    q = torch.log_softmax(torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64), -1)
    logp = torch.log_softmax(logits, -1)
    expected = torch.autograd.grad((logp.exp() * (logp - q)).sum(), logits)[0]
    total = torch.zeros(3, dtype=torch.float64)
    for y in range(3):
        lp = torch.log_softmax(logits, -1)
        loss, _ = reverse_kl_loss(lp[y].view(1, 1), q[y].view(1, 1), torch.ones(1, 1), torch.ones(1), 1)
        total += lp[y].exp().detach() * torch.autograd.grad(loss, logits)[0]
    close(total, expected, tol=1e-10)


def test_reverse_kl_is_micro_batch_invariant():
    g = torch.Generator().manual_seed(3)
    curr = torch.randn(6, 5, generator=g, dtype=torch.float64)
    teacher = torch.randn(6, 5, generator=g, dtype=torch.float64)
    tm = (torch.rand(6, 5, generator=g) > 0.3).double()
    sm = torch.tensor([1.0, 1, 0, 1, 1, 1], dtype=torch.float64)
    n = (tm * sm[:, None]).sum()
    c1 = curr.clone().requires_grad_(True)
    full, _ = reverse_kl_loss(c1, teacher, tm, sm, n)
    full.backward()
    c2 = curr.clone().requires_grad_(True)
    parts = [reverse_kl_loss(c2[i : i + 2], teacher[i : i + 2], tm[i : i + 2], sm[i : i + 2], n)[0] for i in (0, 2, 4)]
    sum(parts).backward()
    close(sum(parts), full, tol=1e-12)
    close(c2.grad, c1.grad, tol=1e-12)
