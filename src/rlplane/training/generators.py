"""``policy.generation.num_generators`` rollout workers used like one.

A rollout spreads prompts over them by whole group, contiguously; results come back in prompt order as
one generator's would (receipts and carries concatenated, metrics merged). Sampling is seeded per sample
key, so with ``hf`` any number of generators draws the same samples.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlplane.dataplane import concat_metas
from rlplane.runtime.groups import LocalGroup, RayGroup, spread
from rlplane.workers.env_metrics import is_env_metric, merge_env_metrics
from rlplane.workers.rollout import RolloutWorker

# Event counts are summed; ``max_*`` take the maximum; the rest are means weighted by rows.
COUNT_METRICS = ("env_errors", "env_retries", "rollout_failures", "rollout_retries")


def merge_metrics(parts: Sequence[tuple[dict[str, float], int]]) -> dict[str, float]:
    """One rollout's metrics from each generator's ``(metrics, rows)``: counts summed, ``max_*`` max, others by
    rows; ``env/<task>/*`` by each task's samples (:func:`merge_env_metrics`)."""
    total = sum(rows for _, rows in parts) or 1
    out = merge_env_metrics([m for m, _ in parts])
    for k in dict.fromkeys(k for m, _ in parts for k in m if not is_env_metric(k)):
        vals = [(m[k], rows) for m, rows in parts if k in m]
        if k in COUNT_METRICS:
            out[k] = float(sum(v for v, _ in vals))
        elif k.startswith("max_"):
            out[k] = float(max(v for v, _ in vals))
        else:
            out[k] = float(sum(v * rows for v, rows in vals)) / total
    return out


class Generators:
    """The rollout workers used like one, through typed calls; ``sleeps``: they release their weights until the
    next refit (colocated under Ray)."""

    def __init__(self, group: LocalGroup | RayGroup, sleeps: bool = False):
        self.group, self.sleeps = group, sleeps
        self._last_ranks: list[int] = [0]  # the generators of the last rollout, for last_samples

    def __len__(self) -> int:
        return len(self.group)

    def rollout(self, datums: Sequence, *, group_size: int, partition_id: str | None, **kwargs):
        """:meth:`RolloutWorker.rollout` of ``datums`` spread by whole group over the generators."""
        ranges = [(r, a, b) for r, (a, b) in enumerate(spread(len(datums), len(self))) if b > a]
        handles = [self.group.lazy(RolloutWorker.rollout, datums[a:b], group_size=group_size,
                                   partition_id=partition_id, **kwargs, rank=r) for r, a, b in ranges]
        results = self.group.wait(handles)
        self._last_ranks = [r for r, _, _ in ranges]
        if len(results) == 1:
            return results[0]
        metas = [meta for meta, _, _ in results]
        carries = []
        for (_, a, _), (_, c, _) in zip(ranges, results):
            carries.append({**c, "group": c["group"] + a})  # a generator numbers its groups from 0
        carry = {k: torch.cat([c[k] for c in carries]) for k in carries[0]}
        metrics = merge_metrics([(m, len(c["rewards"])) for (_, c, m) in results])
        return (None if partition_id is None else concat_metas(metas)), carry, metrics

    def last_samples(self, limit: int | None = None) -> list[dict]:
        parts = self.group.wait([self.group.lazy(RolloutWorker.last_samples, rank=r) for r in self._last_ranks])
        return [s for part in parts for s in part][:limit]

    def ping(self) -> None:
        """Returns once every generator's constructor has (under Ray, raises what one raised)."""
        self.group.run(RolloutWorker.ping)

    def set_weight_version(self, version: int) -> None:
        """The weight version every generator seeds its next rollouts with."""
        self.group.run(RolloutWorker.set_weight_version, version)

    def sleep(self) -> None:
        """Every generator releases its weights until the next :meth:`update_weights`."""
        self.group.run(RolloutWorker.sleep)

    def rng_state(self) -> list:
        """Each generator's sampling RNG state (engines without per-sample seeds use it)."""
        return self.group.run(RolloutWorker.rng_state)

    def set_rng_state(self, state) -> None:
        """One state per generator (a single one goes to generator 0); only engines without per-sample seeds use it."""
        states = state if isinstance(state, list) else [state]
        self.group.wait([self.group.lazy(RolloutWorker.set_rng_state, s, rank=r)
                         for r, s in enumerate(states[: len(self)])])

    def update_weights(self, weights, version: int | None = None) -> None:
        """Every generator loads ``weights`` as ``version`` (under Ray one object reference, resolved in each)."""
        self.group.run(RolloutWorker.update_weights, weights, version=version)

    def weight_reports(self, probe: bool, fingerprint: bool = True) -> list:
        """Each generator's :class:`~rlplane.workers.weight_sync.GeneratorReport`, in generator order."""
        return self.group.run(RolloutWorker.weight_report, probe, fingerprint)

    def placement(self) -> list[dict]:
        """Where each generator runs (node, placement group, bundle; ``runtime: ray``)."""
        return self.group.run(RolloutWorker.placement)

    def close(self) -> None:
        if isinstance(self.group, LocalGroup):  # a Ray actor's environments go with its processes
            self.group.run(RolloutWorker.close)
        self.group.close()
