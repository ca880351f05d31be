"""Small things every recipe's loop uses: the step timer, the stop signal, held-out validation."""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from rlplane.config.loops import RolloutLoopConfig
from rlplane.dataplane import DataPlaneClient
from rlplane.dataplane.columns import ROLLOUT_COLUMNS
from rlplane.runtime.groups import LocalActor, RayActor
from rlplane.training.samples import val_samples
from rlplane.utils.answer_spread import constant_answer_accuracy, top_answer_share
from rlplane.workers.env_metrics import merge_env_metrics

VAL_PARTITION = "val"  # validation rollouts' columns, cleared after each validation


class TrainingStopped(RuntimeError):
    """The run cannot go on for a reason the user can act on (one-line message)."""


class DataExhausted(Exception):
    """The loop's ``max_num_epochs`` passes over the training prompts are used up."""


class Timer:
    def __init__(self):
        self.times: dict[str, float] = {}
        self._t0 = time.perf_counter()

    @contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        yield
        self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        """``timing/train/*`` of every timed part, and ``total_step_time`` since the timer was made."""
        out = {f"timing/train/{k}": v for k, v in self.times.items()}
        out["timing/train/total_step_time"] = time.perf_counter() - self._t0
        return out


def validate(loop: RolloutLoopConfig, rollout: LocalActor | RayActor, datums: list,
             data_plane: DataPlaneClient, tokenizer) -> tuple[dict[str, float], list[dict]]:
    """Greedy accuracy on the held-out set (sampled at ``policy.generation.val_temperature`` where set, as NeMo RL;
    pass@k when k > 1), the environments' ``env/<task>/*`` metrics of those answers, how spread out they are
    (``top_answer_share``, and the accuracy one constant answer would reach: ``constant_answer_accuracy``, where
    every problem has a reference answer), and the answers as samples.jsonl rows.

    As NeMo RL's ``validate_sync``, per batch: ``VAL_PARTITION`` registered, the samples put under its keys,
    the driver reads the carry and the samples' text from the plane, the partition cleared.
    """
    g = loop
    datums = datums[: g.max_val_samples]
    k = g.val_num_generations_per_prompt
    correct, passed, samples, env_parts = [], [], [], []
    for i in range(0, len(datums), g.val_batch_size):
        batch = datums[i : i + g.val_batch_size]
        data_plane.register_partition(VAL_PARTITION, list(ROLLOUT_COLUMNS), len(batch) * (1 + (k > 1) * k))
        # A round trip, so Ray orders the register above before the rollout worker's puts.
        data_plane.list_samples(VAL_PARTITION)
        try:
            meta, carry, rollout_metrics = rollout.rollout(batch, group_size=1, partition_id=VAL_PARTITION,
                                                           greedy=True, heldout=True)
            correct.append(carry["rewards"])
            env_parts.append(rollout_metrics)
            samples += val_samples(data_plane, meta, carry, batch, tokenizer)
            if k > 1:
                _, carry, _ = rollout.rollout(batch, group_size=k, partition_id=VAL_PARTITION, greedy=False,
                                              heldout=True)
                passed.append((carry["rewards"].view(-1, k) > 0).any(dim=1).float())
        finally:
            data_plane.clear_samples(None, VAL_PARTITION)
    out = {"accuracy": float(torch.cat(correct).double().mean()), **merge_env_metrics(env_parts),
           "top_answer_share": top_answer_share([s["completion"] for s in samples])}
    references = [d.ground_truth for d in datums]
    if all(r is not None for r in references):
        out["constant_answer_accuracy"] = constant_answer_accuracy(references)[0]
    if passed:
        out[f"pass@{g.val_num_generations_per_prompt}"] = float(torch.cat(passed).double().mean())
    return out, samples
