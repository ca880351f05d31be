"""Worker groups: the same worker classes run in-process (`local`) or as Ray actors (`ray`).

A group holds one worker per rank and calls a method on all of them, with per-rank arguments
(for sharded calls) or the same arguments, returning the results in rank order. Nothing in the
workers knows which runtime they run under, so `runtime: local` is debuggable with breakpoint().
"""

from __future__ import annotations

import os
from typing import Any

WORKER_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}


class LocalGroup:
    """Workers constructed in this process; calls run one after the other."""

    def __init__(self, cls: type, per_rank_kwargs: list[dict[str, Any]]):
        self.workers = [cls(**kw) for kw in per_rank_kwargs]

    def __len__(self) -> int:
        return len(self.workers)

    def run(self, method: str, *args, per_rank: list[dict] | None = None, **kwargs) -> list:
        return [
            getattr(w, method)(*args, **kwargs, **(per_rank[i] if per_rank else {})) for i, w in enumerate(self.workers)
        ]


class RayGroup:
    """One Ray actor per rank; calls are issued to all ranks at once and awaited together."""

    def __init__(self, cls: type, per_rank_kwargs: list[dict[str, Any]], num_cpus: float = 1.0, num_gpus: float = 0.0):
        import ray

        remote_cls = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, runtime_env={"env_vars": WORKER_ENV})(cls)
        self.workers = [remote_cls.remote(**kw) for kw in per_rank_kwargs]

    def __len__(self) -> int:
        return len(self.workers)

    def run(self, method: str, *args, per_rank: list[dict] | None = None, **kwargs) -> list:
        import ray

        refs = [
            getattr(w, method).remote(*args, **kwargs, **(per_rank[i] if per_rank else {}))
            for i, w in enumerate(self.workers)
        ]
        return ray.get(refs)

    def kill(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)


def init_ray(num_cpus: int | None = None, address: str | None = None, num_gpus: int | None = None) -> None:
    """Start (or join) Ray once per process, quietly and without the dashboard."""
    import tempfile

    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": WORKER_ENV})
    if address:
        ray.init(address=address, **kwargs)
    else:
        ray.init(num_cpus=num_cpus, num_gpus=num_gpus, _temp_dir=tempfile.mkdtemp(prefix="rlplane-ray-"), **kwargs)
