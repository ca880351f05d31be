"""Evaluation on the training run's held-out problems: greedy accuracy and sampled pass@k.

Metrics: ``accuracy`` (mean greedy reward), ``pass@k`` (the unbiased ``1 - C(n-c, k) / C(n, k)`` of
Chen et al. 2021 at n = k, reward 1 as correct), ``fraction_properly_ended``, ``mean/max_generation_length``,
and ``constant_answer`` (the accuracy of always giving the commonest reference answer: what a policy that
collapses onto one answer would score).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time

import torch

from rlplane.config.data import DataConfig
from rlplane.config.schema import RunConfig
from rlplane.fast.threads import set_worker_threads
from rlplane.utils.answer_spread import constant_answer_accuracy


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct (Chen et al. 2021, eq. 1)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def generation_metrics(
    rewards: torch.Tensor, truncated: torch.Tensor, lengths: torch.Tensor, max_new_tokens: int
) -> dict[str, float]:
    """Mean reward, properly-ended fraction and response lengths of a flat (B,) batch.

    Properly ended: stopped before ``max_new_tokens`` (stopping on the last allowed token counts as cut).
    """
    ended = ~truncated & (lengths < max_new_tokens)
    return {
        "mean_reward": float(rewards.double().mean()),
        "fraction_properly_ended": float(ended.double().mean()),
        "mean_generation_length": float(lengths.double().mean()),
        "max_generation_length": int(lengths.max()),
    }


def evaluate(
    cfg: RunConfig, *, num_problems: int | None = None, k: int = 1, batch_size: int = 32, progress: bool = True
) -> dict:
    """Greedy accuracy (and pass@k when ``k > 1``) of ``cfg``'s model on ``num_problems`` held-out problems."""
    from rlplane.datasets import build_datasets
    from rlplane.models.configured import load_configured_policy
    from rlplane.models.precision import hidden_size_of
    from rlplane.training.plan import rollout_options
    from rlplane.utils.seeding import seed_everything
    from rlplane.workers.environments import EnvBlock
    from rlplane.workers.rollout import RolloutWorker

    t0 = time.perf_counter()
    seed_everything(cfg.loop.seed)
    model, tokenizer = load_configured_policy(cfg.policy, cfg.loop.seed)
    set_worker_threads(cfg.policy.threads_per_worker, hidden_size_of(model))
    # Room for any prompt: the sequence cap below is set from the longest one.
    roomy = dataclasses.replace(cfg.dataset_options(), max_prompt_length=(1 << 20) - 1)
    _, datums, _ = build_datasets(roomy, tokenizer, train=False)
    datums = datums[: num_problems or cfg.loop.max_val_samples]
    max_new = cfg.policy.generation.max_new_tokens
    longest = max(d.length for d in datums)
    run_cfg = cfg.model_copy(
        update={"policy": cfg.policy.model_copy(update={"max_total_sequence_length": longest + max_new})})
    worker = RolloutWorker(rollout_options(run_cfg), EnvBlock(run_cfg.env), None, model=model, tokenizer=tokenizer,
                           seed=cfg.loop.seed)

    greedy = {"rewards": [], "truncated": [], "lengths": []}
    sampled = {"rewards": [], "truncated": [], "lengths": []}
    bar = None
    if progress and sys.stderr.isatty():  # a bar's redraws would flood a captured log
        from tqdm import tqdm

        bar = tqdm(total=len(datums), desc="eval", unit="problem", file=sys.stderr, dynamic_ncols=True)
    for i in range(0, len(datums), batch_size):
        batch = datums[i : i + batch_size]
        for out, group, is_greedy in ((greedy, 1, True), (sampled, k, False)):
            if not is_greedy and k <= 1:
                continue
            _, carry, _ = worker.rollout(batch, group_size=group, partition_id=None, greedy=is_greedy)
            out["rewards"].append(carry["rewards"])
            out["truncated"].append(carry["truncated"])
            out["lengths"].append(carry["response_lengths"])
        if bar is not None:
            bar.update(len(batch))
            bar.set_postfix(accuracy=f"{float(torch.cat(greedy['rewards']).double().mean()):.3f}")
    if bar is not None:
        bar.close()

    def cat(d):
        return {key: torch.cat(v) for key, v in d.items()}

    g = cat(greedy)
    result = {
        "model": cfg.policy.model_name,
        "dataset": describe_dataset(cfg.data),
        "num_problems": len(datums),
        "sampling_seed": cfg.loop.seed,
        "max_new_tokens": max_new,
        "accuracy": float(g["rewards"].double().mean()),
        "greedy": generation_metrics(g["rewards"], g["truncated"], g["lengths"], max_new),
    }
    references = [d.ground_truth for d in datums]
    if all(r is not None for r in references):  # headroom a collapse onto one answer would reach
        accuracy, answer = constant_answer_accuracy(references)
        result["constant_answer"] = {"answer": answer, "accuracy": accuracy}
    if k > 1:
        s = cat(sampled)
        correct = (s["rewards"].view(-1, k) >= 1.0).sum(dim=1).tolist()  # fully correct samples per problem
        result[f"pass@{k}"] = sum(pass_at_k(k, c, k) for c in correct) / len(correct)
        result["pass@1_sampled"] = sum(pass_at_k(k, c, 1) for c in correct) / len(correct)
        result["sampled"] = {
            "k": k, "temperature": cfg.policy.generation.temperature,
            **generation_metrics(s["rewards"], s["truncated"], s["lengths"], max_new),
        }
    worker.close()
    result["wall_seconds"] = round(time.perf_counter() - t0, 1)
    return result


def describe_dataset(d: DataConfig) -> str:
    """The held-out set in a few words, for the result: kind, and its source or its settings."""
    if d.dataset == "reasoning_gym":
        r = d.reasoning_gym
        return f"reasoning_gym:{','.join(r.tasks)} (held-out seed {r.val_seed})"
    if d.dataset == "arithmetic":
        a = d.arithmetic
        return f"arithmetic ({''.join(a.operators)}, operands {a.min_operand}..{a.max_operand})"
    src = d.validation or d.train
    return f"{d.dataset}:{src.path}"
