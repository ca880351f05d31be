"""Slow Python-loop twins of the vectorized kernels, straight from the seeds' formulas; for equivalence tests only."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def baseline_and_std_loop(
    prompt_ids: Tensor, rewards: Tensor, valid_mask: Tensor, leave_one_out: bool = True
) -> tuple[Tensor, Tensor]:
    """Twin of :func:`~rlplane.algorithms.advantages.calculate_baseline_and_std_per_prompt`, from the definition."""
    b = rewards.shape[0]
    keys = [tuple(prompt_ids[i].reshape(-1).tolist()) for i in range(b)]
    r, v = rewards.tolist(), [float(x) != 0 for x in valid_mask.tolist()]
    baseline, std = [0.0] * b, [0.0] * b
    for i in range(b):
        members = [j for j in range(b) if keys[j] == keys[i] and v[j]]
        if len(members) <= 1:
            baseline[i], std[i] = r[i], 0.0
            continue
        others = [r[j] for j in members if not (leave_one_out and j == i)]
        k = len(others)
        if all(x == others[0] for x in others):
            baseline[i], std[i] = others[0], 0.0
            continue
        mean = sum(others) / k
        baseline[i] = mean
        std[i] = math.sqrt(sum((x - mean) ** 2 for x in others) / (k - 1))
    return torch.tensor(baseline, dtype=torch.float64), torch.tensor(std, dtype=torch.float64)


def gae_loop(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float | list[float]
) -> tuple[Tensor, Tensor]:
    """Twin of GAE without KL or whitening: returns (advantages (0 outside the mask), returns)."""
    b, t = values.shape
    adv = [[0.0] * t for _ in range(b)]
    ret = [[0.0] * t for _ in range(b)]
    for i in range(b):
        lam_i = lam[i] if isinstance(lam, list) else lam
        m = [float(x) for x in mask[i].tolist()]
        vals = [values[i, s].item() if m[s] else 0.0 for s in range(t)]
        valid_positions = [s for s in range(t) if m[s]]
        token_r = [0.0] * t
        if valid_positions:
            token_r[valid_positions[-1]] = rewards[i].item() * m[valid_positions[-1]]
        # Walk only the valid tokens: masked ones are skipped.
        next_v, gae = 0.0, 0.0
        for s in reversed(valid_positions):
            delta = token_r[s] + gamma * next_v - vals[s]
            gae = delta + gamma * lam_i * gae
            next_v = vals[s]
            adv[i][s] = gae
        for s in range(t):
            ret[i][s] = adv[i][s] + vals[s] if m[s] else float("nan")
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


def pg_loss_loop(
    curr: Tensor, prev: Tensor, adv: Tensor, token_mask: Tensor, sample_mask: Tensor,
    global_valid_tokens: float, global_valid_seqs: float, *, eps_low: float, eps_high: float,
    clip_c: float | None, token_level: bool,
) -> float:
    """Twin of the clipped PG actor loss (no KL, no IS) with token- or sequence-level aggregation."""
    b, t = curr.shape
    total = 0.0
    for i in range(b):
        seq_sum, seq_n = 0.0, 0.0
        for s in range(t):
            if not token_mask[i, s] or not sample_mask[i]:
                continue
            r = math.exp(curr[i, s].item() - prev[i, s].item())
            rc = min(max(r, 1 - eps_low), 1 + eps_high)
            a = adv[i, s].item()
            term = max(-a * r, -a * rc)
            if clip_c is not None and a < 0:
                term = min(term, -a * clip_c)
            w = float(token_mask[i, s]) * float(sample_mask[i])
            if token_level:
                total += term * w
            else:
                seq_sum += term * float(token_mask[i, s])
                seq_n += float(token_mask[i, s])
        if not token_level and seq_n > 0:
            total += float(sample_mask[i]) * seq_sum / seq_n
    return total / (global_valid_tokens if token_level else global_valid_seqs)


def topk_kl_loss_loop(student_logits: Tensor, teacher_topk_logits: Tensor, indices: Tensor, mask: Tensor,
                      global_valid_tokens: float, kl_type: str, weight: float, zero_outside_topk: bool) -> float:
    """Twin of :func:`~rlplane.algorithms.distillation_kl.topk_kl_loss` over
    :func:`~rlplane.algorithms.distillation_kl.topk_distillation_logprobs`, one token at a time in plain floats."""
    total = 0.0
    b, t, v = student_logits.shape
    for i in range(b):
        for j in range(t):
            if not mask[i, j]:
                continue
            z = [float(x) for x in student_logits[i, j]]
            top = [int(x) for x in indices[i, j]]
            tz = [float(x) for x in teacher_topk_logits[i, j]]
            tn = math.log(sum(math.exp(x) for x in tz))
            lt = [x - tn for x in tz]  # teacher log-probs over its k
            full = math.log(sum(math.exp(x) for x in z))
            if zero_outside_topk:
                ls = [z[k] - full for k in top]
            else:
                sn = math.log(sum(math.exp(z[k]) for k in top))
                ls = [z[k] - sn for k in top]
            fwd = sum(math.exp(a) * (a - c) for a, c in zip(lt, ls))
            rev = sum(math.exp(c) * (c - a) for a, c in zip(lt, ls))
            if zero_outside_topk and kl_type != "forward":
                neg_h = sum(math.exp(x - full) * (x - full) for x in z)
                rev += (neg_h - sum(math.exp(c) * c for c in ls)) + 100.0 * (1.0 - sum(math.exp(c) for c in ls))
            total += {"forward": fwd, "reverse": rev, "mixed": weight * fwd + (1 - weight) * rev}[kl_type]
    return total / global_valid_tokens
