"""Weight-sync fault trials: each fault kind injected ``--trials`` times per runtime, and where it was found.

A trial is one GRPO run on the tiny model (``policy.generation.verify_weights=warn``) in which one
generator suffers every kind of a group (tests/unit/training/weight_faults.py) at its own refit;
the LoRA kinds run with ``policy.lora.enabled``. Trial t has seed 42 + t, its faults t refits later
than trial 0's, and, with two generators (``local``, ``ray``), generator t % 2 faulted; ``async`` faults
the async GRPO collector's generator. A fault is detected when the check of the refit it shows at (a
restart: the next one) names that generator; any other mismatch is counted as spurious.

    python benchmarks/weight_faults.py [--trials 3] [--runtimes local,ray,async] [--backend hf|vllm]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from unittest import mock

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the fault seam lives with the tests

import torch  # noqa: E402

from rlplane.config.loading import load_config  # noqa: E402
from rlplane.recipes import async_grpo, grpo  # noqa: E402
from rlplane.training.weight_check import WeightCheck  # noqa: E402
from tests.unit.training import weight_faults as wf  # noqa: E402

ASYNC_GENERATOR = 3  # the collector's generator is seeded with the run's seed + 3


def run_trial(runtime: str, kinds: list[str], t: int, backend: str, tmp: str) -> tuple[list[dict], int]:
    """One run; per injected fault: kind, refit injected, refit detected (None: not). And the spurious count."""
    faults, seed = wf.schedule(kinds, offset=t), 42 + t
    generator = ASYNC_GENERATOR if runtime == "async" else t % 2
    found: list[tuple[str, int, int]] = []  # (label, generator index, version) of every mismatch
    mismatch = WeightCheck._mismatch

    def record(self, i, n, r, trainer, version, shared, problem):
        found.append((self.label, i, version))
        return mismatch(self, i, n, r, trainer, version, shared, problem)

    common = [f"run_dir={tmp}", f"grpo.max_num_steps={max(faults) + 3}", f"grpo.seed={seed}",
              "policy.generation.verify_weights=warn", f"policy.generation.backend={backend}",
              *(["policy.lora.enabled=true"] if kinds == wf.LORA else [])]
    worker = wf.faulty_worker(faults, generator=generator, varied_rewards=True)
    with mock.patch.object(WeightCheck, "_mismatch", record):
        if runtime == "async":
            small = [o for o in wf.SMALL if not o.startswith("policy.generation.num_generators")]
            with mock.patch("rlplane.async_rl.collector.RolloutWorker", worker):
                async_grpo.train(load_config("grpo_arithmetic_async", [*small, *common]), quiet=True)
        else:
            with mock.patch("rlplane.training.workers.RolloutWorker", worker):
                grpo.train(load_config(None, [*wf.SMALL, *wf.RUNTIMES[runtime], *common]), quiet=True)
    index = 0 if runtime == "async" else generator
    out, expected = [], set()
    for n, kind in sorted(faults.items()):
        at = n + wf.DETECTED_AFTER.get(kind, 0)
        expected.add(at)
        hit = any(i == index and v == at for _, i, v in found)
        out.append(dict(kind=kind, trial=t, generator=generator, injected=n, detected=at if hit else None))
    spurious = sum(not (i == index and v in expected) for _, i, v in found)
    return out, spurious


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--runtimes", default="local,ray,async")
    ap.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    ap.add_argument("--kinds", default="plain,lora", help="plain, lora or both")
    args = ap.parse_args()
    torch.set_num_threads(1)
    runtimes = args.runtimes.split(",")
    if "ray" in runtimes:
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=512 * 2**20)
        wf.ship_to_ray()
    groups = {"plain": wf.PLAIN, "lora": wf.LORA}
    results: dict[tuple[str, str], list[dict]] = {}
    spurious: dict[str, int] = {}
    for runtime in runtimes:
        for group in args.kinds.split(","):
            for t in range(args.trials):
                with tempfile.TemporaryDirectory(prefix="rlplane-faults-") as tmp:
                    rows, extra = run_trial(runtime, groups[group], t, args.backend, tmp)
                spurious[runtime] = spurious.get(runtime, 0) + extra
                for r in rows:
                    results.setdefault((runtime, r["kind"]), []).append(r)
                    print(f"trial {t}: {args.backend} {runtime:<5} {r['kind']:<10} generator {r['generator']} "
                          f"injected at refit {r['injected']}, detected at {r['detected']}", flush=True)
    print("\n| backend | runtime | fault | injected | detected | refit injected -> detected | spurious |")
    print("|---|---|---|---|---|---|---|")
    ok = True
    for (runtime, kind), rows in results.items():
        hits = sum(r["detected"] is not None for r in rows)
        ok &= hits == len(rows) and not spurious[runtime]
        pairs = ", ".join(f"{r['injected']}->{'-' if r['detected'] is None else r['detected']}" for r in rows)
        print(f"| {args.backend} | {runtime} | {kind} | {len(rows)} | {hits} | {pairs} | {spurious[runtime]} |")
    print("every fault found within one step in every trial" if ok else "NOT every fault was found")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
