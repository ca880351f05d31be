"""Rollout failures under ``rollout_failure_policy``: ``zero_reward`` (scored 0, trained), ``retry`` (re-run
on a fresh environment, then 0), ``drop_group`` (the group leaves the step and is refilled). Metrics
``rollout_failures``, ``rollout_retries``, ``dropped_groups`` are sums over the step's batches.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

FAILURE_COUNTS = ("rollout_failures", "rollout_retries", "dropped_groups")
FAILED_GROUPS_HINT = (
    "too many prompt groups had a sample whose environment failed (rollout_failure_policy = drop_group; "
    "the warnings above say why); fix the environment, or set rollout_failure_policy=retry or zero_reward, "
    "or raise dynamic_sampling_max_gen_batches"
)


def num_failed_groups(group: torch.Tensor, failed: torch.Tensor) -> int:
    """How many distinct groups (``group`` (B,) ids) hold at least one failed sample (``failed`` (B,) bool)."""
    return int(torch.unique(group[failed.bool()]).numel())


def add_failure_counts(
    totals: Mapping[str, float], rollout_metrics: Mapping[str, float], carry: Mapping[str, torch.Tensor],
    drop_failed_groups: bool,
) -> dict[str, float]:
    """``totals`` plus one generation batch's failure counts (its rollout metrics and (B,) carry)."""
    dropped = num_failed_groups(carry["group"], carry["env_failed"]) if drop_failed_groups else 0
    return {
        "rollout_failures": totals["rollout_failures"] + float(rollout_metrics.get("rollout_failures", 0.0)),
        "rollout_retries": totals["rollout_retries"] + float(rollout_metrics.get("rollout_retries", 0.0)),
        "dropped_groups": totals["dropped_groups"] + float(dropped),
    }
