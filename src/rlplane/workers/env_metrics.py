"""Each environment's own metrics of a rollout (NeMo RL's ``global_post_process_and_metrics``), as
``env/<task_name>/<name>`` plus ``num_samples``. Merging several calls' (:func:`merge_env_metrics`): per task,
``num_samples`` and ``actor_deaths`` summed, ``max_*`` / ``min_*`` the extreme, the rest weighted by samples.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from rlplane.envs.interface import EnvBatch

log = logging.getLogger("rlplane.workers.turns")

PREFIX = "env/"
NUM_SAMPLES = "num_samples"
COUNTS = (NUM_SAMPLES, "actor_deaths")  # summed when merged; actor_deaths: a pool's actors that died (runtime: ray)


def env_metrics(task_names: Sequence[str], rewards: torch.Tensor, batch: EnvBatch,
                metrics_of: Callable[[str], Callable[[torch.Tensor, EnvBatch], Mapping[str, float]]]
                ) -> dict[str, float]:
    """``metrics_of(task)(rewards, batch)`` on each task's samples (``task_names``: one per sample), as
    ``env/<task>/<name>``; metrics that raise are a warning, not the end of the run."""
    out: dict[str, float] = {}
    for task in dict.fromkeys(task_names):
        idx = torch.tensor([i for i, t in enumerate(task_names) if t == task])
        sub = EnvBatch(batch.group[idx], batch.truncated[idx], batch.prompt_lengths[idx], batch.response_lengths[idx])
        try:
            values = {k: float(v) for k, v in metrics_of(task)(rewards[idx], sub).items()}
        except Exception as e:  # noqa: BLE001 - a user's metrics must not end the run
            log.warning("environment %r: metrics() raised %s: %s (no env/%s/* metrics for this rollout)",
                        task, type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "", task)
            continue
        out.update({f"{PREFIX}{task}/{k}": v for k, v in values.items()})
        out[f"{PREFIX}{task}/{NUM_SAMPLES}"] = float(len(idx))
    return out


def is_env_metric(key: str) -> bool:
    return key.startswith(PREFIX)


def merge_env_metrics(parts: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The ``env/`` metrics of several rollout calls' ``parts`` as one (other keys left out)."""
    out: dict[str, float] = {}
    weights: dict[str, float] = {}  # task -> samples so far
    for part in parts:
        tasks = {k[len(PREFIX):].rsplit("/", 1)[0] for k in part if is_env_metric(k)}
        for task in tasks:
            head = f"{PREFIX}{task}/"
            n = float(part.get(head + NUM_SAMPLES, 0.0))
            before = weights.get(task, 0.0)
            for key, value in part.items():
                if not key.startswith(head) or "/" in key[len(head):]:
                    continue
                name = key[len(head):]
                if key not in out or name in COUNTS:
                    out[key] = float(value) + (out.get(key, 0.0) if name in COUNTS else 0.0)
                elif name.startswith("max_"):
                    out[key] = max(out[key], float(value))
                elif name.startswith("min_"):
                    out[key] = min(out[key], float(value))
                elif before + n > 0:
                    out[key] = (out[key] * before + float(value) * n) / (before + n)
            weights[task] = before + n
    return out
