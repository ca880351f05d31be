"""Supervised warm-up: NLL on answer tokens and the closing eos, stopping once held-out accuracy reaches
``target_accuracy``."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from rlplane.algorithms.losses import nll_loss
from rlplane.config.schema import WarmupConfig
from rlplane.workers.logprobs import token_logprobs


def sft_batch(prompts: Sequence[Sequence[int]], answers: Sequence[Sequence[int]], pad_id: int):
    """Right-padded (B, T) ids, attention mask and a loss mask that covers answer tokens only."""
    seqs = [list(p) + list(a) for p, a in zip(prompts, answers)]
    T = max(len(x) for x in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), T), dtype=torch.long)
    loss_mask = torch.zeros((len(seqs), T))
    for i, (p, x) in enumerate(zip(prompts, seqs)):
        ids[i, : len(x)] = torch.tensor(x)
        attn[i, : len(x)] = 1
        loss_mask[i, len(p) : len(x)] = 1.0
    return ids, attn, loss_mask


def supervised_warmup(
    model,
    batches: Callable[[int], tuple[list[list[int]], list[list[int]]]],
    cfg: WarmupConfig,
    evaluate: Callable[[], float],
    pad_id: int,
    log: Callable[[str], None] = print,
) -> dict[str, float]:
    """Train ``model`` in place on ``batches(n)`` (prompt ids, answer ids + eos); returns steps, accuracy, seconds."""
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    warm = max(cfg.warmup_steps, 1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
    t0 = time.perf_counter()
    acc, step = float("nan"), 0
    model.train()
    for step in range(1, cfg.num_steps + 1):
        prompts, answers = batches(cfg.batch_size)
        ids, attn, loss_mask = sft_batch(prompts, answers, pad_id)
        logp = token_logprobs(model, ids, attn, temperature=1.0)[:, 1:]  # (B, T-1)
        mask = loss_mask[:, 1:]
        loss, _ = nll_loss(logp, mask, global_valid_tokens=mask.sum())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % cfg.eval_every == 0 or step == cfg.num_steps:
            acc = evaluate()
            model.train()
            log(f"warm-up step {step}: loss {float(loss.detach()):.3f}, held-out accuracy {acc:.3f}")
            if cfg.target_accuracy is not None and acc >= cfg.target_accuracy:
                break
    return {"steps": step, "accuracy": acc, "seconds": time.perf_counter() - t0}
