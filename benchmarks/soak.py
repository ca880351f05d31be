"""Soak: a full async GRPO run of thousands of steps, its resources logged every N steps: flat or not.

The embedded tiny policy with a tiny config (2 prompts x 2 generations, a few new tokens, no
validation, no checkpoints), so a step takes a fraction of a second and the run stresses what
repeats every step: the collector's batches, refits, the data plane's keys. Every ``--every`` steps
(at the end of the step, from inside the run) it records the driver's RSS and open file descriptors;
the collector's (its child process with ``--collector process``) or every Ray actor's (``--runtime
ray``), RSS and descriptors summed; the Ray object store's bytes in use; and the data plane's index
for the training partition (live keys, slots, tombstones, chunks, index bytes).

A figure is flat when its growth over the second half of the run (the sample at the midpoint to the
last) stays within a tolerance: RSS 5% or 16 MiB, descriptors 4, object store 16 MiB, the index's bytes 10%
or 4 KiB (its keys lengthen with the step number), its counts none beyond the first
half's maximum. The first half absorbs start-up (allocator pools, caches).

    nice -n 5 flock /tmp/rlplane-cpu.lock env PYTHONPATH=src python benchmarks/soak.py --steps 2000 \\
        [--every 100] [--collector thread|process] [--runtime local|ray] [--out soak.jsonl] [KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import psutil  # noqa: E402

from rlplane.config.loading import load_config  # noqa: E402
from rlplane.config.schema import RunConfig  # noqa: E402
from rlplane.recipes import async_grpo  # noqa: E402
from rlplane.training.session import Session  # noqa: E402

TINY = [
    "warmup.enabled=false", "grpo.num_prompts_per_step=2", "grpo.num_generations_per_prompt=2",
    "policy.train_global_batch_size=4", "policy.train_micro_batch_size=4", "policy.logprob_batch_size=4",
    "policy.generation.max_new_tokens=4", "grpo.val_period=0", "grpo.val_at_start=false", "grpo.val_at_end=false",
    "policy.tiny.hidden_size=16", "policy.tiny.intermediate_size=16", "policy.tiny.num_layers=1",
    "logger.tensorboard_enabled=false", "logger.progress_bar=false", "checkpointing.enabled=false",
    "data.num_train_samples=64",
]
MIB = 2**20
# resource -> (relative, absolute) growth allowed over the second half; index sizes: none.
TOLERANCE = {"driver_rss": (0.05, 16 * MIB), "workers_rss": (0.05, 16 * MIB), "driver_fds": (0, 4),
             "workers_fds": (0, 4), "object_store_bytes": (0, 16 * MIB), "index_bytes": (0.1, 4096)}
INDEX = ("live_keys", "slots", "tombstones", "chunks")


def soak_config(steps: int, run_dir: str, collector: str = "thread", runtime: str = "local",
                extra: list[str] = ()) -> RunConfig:
    ray = ["runtime=ray", "data_plane.backend=ray", "cluster.num_cpus=2"] if runtime == "ray" else []
    return load_config("grpo_arithmetic_async", [
        *TINY, *ray, f"grpo.max_num_steps={steps}", f"run_dir={run_dir}",
        f"grpo.async_grpo.collector_process={str(collector == 'process').lower()}", *extra])


def _rss_fds(procs: list[psutil.Process]) -> tuple[int, int]:
    rss = fds = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            rss += p.memory_info().rss
            fds += p.num_fds()
    return rss, fds


def _ray_actor_procs() -> dict[str, psutil.Process]:
    """This job's live actors by class name (``Name#i`` for several of one class, in pid order), from the GCS
    actor table (the state API needs the dashboard, which is off)."""
    import ray
    from ray._private.state import actors

    table = actors(job_id=ray.JobID.from_hex(ray.get_runtime_context().get_job_id()), actor_state_name="ALIVE")
    found = sorted((a["ActorClassName"], a["Pid"]) for a in table.values() if a.get("Pid"))
    names = [name for name, _ in found]
    return {(name if names.count(name) == 1 else f"{name}#{names[:i].count(name)}"): p
            for i, (name, pid) in enumerate(found) if (p := _proc(pid)) is not None}


def _proc(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def _object_store_bytes() -> int:
    import ray
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    reply = get_memory_info_reply(get_state_from_address(ray.get_runtime_context().gcs_address))
    return int(reply.store_stats.object_store_bytes_used)


def sample(s: Session, step: int, t0: float) -> dict[str, float]:
    """One row of figures, taken from inside the run after step ``step`` (counted from 1)."""
    me = psutil.Process()
    row: dict[str, float] = {"step": step, "seconds": round(time.perf_counter() - t0, 1)}
    row["driver_rss"], row["driver_fds"] = _rss_fds([me])
    if s.cfg.runtime == "ray":
        procs = _ray_actor_procs()
        row["workers_rss"], row["workers_fds"] = _rss_fds(list(procs.values()))
        row.update({f"rss:{name}": _rss_fds([p])[0] for name, p in procs.items()})  # each process's own
        row["object_store_bytes"] = _object_store_bytes()
    elif s.cfg.grpo.async_grpo.collector_process:  # the collector's process and anything it started
        row["workers_rss"], row["workers_fds"] = _rss_fds(me.children(recursive=True))
    fp = s.data_plane.footprint(async_grpo.TRAIN_PARTITION)
    row.update({k: fp[k] for k in INDEX}, index_bytes=fp["bytes"])
    return row


@contextlib.contextmanager
def sampled_every(every: int, rows: list[dict]) -> Iterator[None]:
    """Session.log_step (a step's logging job) records a row after the first step, every ``every`` steps and after
    the last."""
    original, t0 = Session.log_step, time.perf_counter()

    def log_step(self: Session, done: int, metrics: dict[str, float]) -> None:
        original(self, done, metrics)
        if done == 1 or done % every == 0 or done == self.last_step():
            rows.append(sample(self, done, t0))

    Session.log_step = log_step
    try:
        yield
    finally:
        Session.log_step = original


def run_soak(cfg: RunConfig, every: int) -> list[dict]:
    rows: list[dict] = []
    with sampled_every(every, rows):
        async_grpo.train(cfg, quiet=True)
    return rows


def verdict(rows: list[dict]) -> dict[str, tuple[float, float, float, bool]]:
    """Per figure: (first, midpoint, last, flat); a process's own RSS (``rss:NAME``) is held to the RSS tolerance."""
    mid, last = rows[len(rows) // 2], rows[-1]
    out = {}
    for k in [k for k in rows[0] if k not in ("step", "seconds") and k in last]:
        if k in INDEX:
            flat = last[k] <= max(r[k] for r in rows[: len(rows) // 2 + 1])
        else:
            rel, absolute = TOLERANCE["workers_rss" if k.startswith("rss:") else k]
            flat = last[k] - mid[k] <= max(rel * mid[k], absolute)  # key strings lengthen with the step number
        out[k] = (rows[0][k], mid[k], last[k], flat)
    return out


def second_half_slope(rows: list[dict], k: str) -> float:
    """Growth per 1,000 steps from the midpoint sample to the last (bytes for RSS): where a creep shows."""
    mid, last = rows[len(rows) // 2], rows[-1]
    return (last[k] - mid[k]) / max(last["step"] - mid["step"], 1) * 1000


def _show(k: str, v: float) -> str:
    mib = (k.endswith(("rss", "_bytes")) or k.startswith("rss:")) and k != "index_bytes"
    return f"{v / MIB:.1f} MiB" if mib else f"{v:,.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--collector", choices=("thread", "process"), default="thread")
    ap.add_argument("--runtime", choices=("local", "ray"), default="local")
    ap.add_argument("--out", help="write every sampled row here (JSONL)")
    ap.add_argument("overrides", nargs="*", help="config KEY=VALUE overrides")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlplane-soak-") as tmp:
        cfg = soak_config(args.steps, tmp, args.collector, args.runtime, args.overrides)
        t0 = time.perf_counter()
        rows = run_soak(cfg, args.every)
        wall = time.perf_counter() - t0
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    steady = (rows[-1]["seconds"] - rows[0]["seconds"]) / max(rows[-1]["step"] - rows[0]["step"], 1)
    print(f"soak: async GRPO, runtime={args.runtime}, collector={args.collector}, {rows[-1]['step']} steps in "
          f"{wall:.0f} s ({rows[0]['seconds']:.0f} s to the end of step 1, then {steady * 1000:.0f} ms/step), "
          f"sampled every {args.every} steps")
    for r in rows:
        print("  " + " ".join(f"{k}={_show(k, v)}" for k, v in r.items()))
    print(f"{'figure':<32} {'step ' + str(rows[0]['step']):>14} {'step ' + str(rows[len(rows) // 2]['step']):>14} "
          f"{'step ' + str(rows[-1]['step']):>14} {'2nd half /1k steps':>19}  verdict")
    flat_all = True
    for k, (first, mid, last, flat) in verdict(rows).items():
        flat_all &= flat
        slope = _show(k, second_half_slope(rows, k)) if "rss" in k else ""
        print(f"{k:<32} {_show(k, first):>14} {_show(k, mid):>14} {_show(k, last):>14} {slope:>19}  "
              f"{'flat' if flat else 'GROWS'}")
    print("verdict: " + ("flat" if flat_all else "NOT flat"))
    sys.exit(0 if flat_all else 1)


if __name__ == "__main__":
    main()
