"""Wall time of the command line's quick paths, each in a fresh interpreter: ``--help``, ``show-config``, a config
mistake under each command, a NeMo RL file, and the imports they avoid (torch, transformers, Ray) for scale.

Each path runs ``--repeats`` times (interleaved, so load changes hit all alike); the figure is the median,
with the min and max beside it. The exit status each path must have is checked, so a path that broke is
not timed as fast.

    python benchmarks/import_times.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NEMO = ROOT / "tests" / "fixtures" / "nemo" / "grpo_math_1B.yaml"
CLI = [sys.executable, "-m", "rlplane.cli"]
TYPO = "grpo.max_num_step=3"

# (name, argv, exit status it must have)
PATHS = [
    ("python -c pass (floor)", [sys.executable, "-c", "pass"], 0),
    ("rlplane --help", [*CLI, "--help"], 0),
    ("rlplane show-config", [*CLI, "show-config"], 0),
    ("rlplane show-config KEY typo", [*CLI, "show-config", TYPO], 2),
    ("rlplane train KEY typo", [*CLI, "train", TYPO], 2),
    ("rlplane train rule broken", [*CLI, "train", "loss_fn.ratio_clip_c=0.5"], 2),
    ("rlplane eval KEY typo", [*CLI, "eval", "--model", "embedded:tiny-llama", TYPO], 2),
    ("rlplane show-config NeMo RL file", [*CLI, "show-config", "-c", str(NEMO), "data.dataset=arithmetic"], 0),
    ("import torch (avoided)", [sys.executable, "-c", "import torch"], 0),
    ("import transformers (avoided)", [sys.executable, "-c", "import transformers"], 0),
    ("import ray (avoided)", [sys.executable, "-c", "import ray"], 0),
]


def time_once(argv: list[str], expected: int) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    seconds = time.perf_counter() - t0
    if proc.returncode != expected:
        sys.exit(f"{' '.join(argv)}: exit status {proc.returncode}, expected {expected}: {proc.stderr[-500:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    times: dict[str, list[float]] = {name: [] for name, _, _ in PATHS}
    for _ in range(args.repeats):
        for name, argv, expected in PATHS:
            times[name].append(time_once(argv, expected))
    load = os.getloadavg()[0]
    print(f"{'path':36s} {'median s':>9s} {'min':>6s} {'max':>6s}   (repeats {args.repeats}, load {load:.1f})")
    for name, values in times.items():
        print(f"{name:36s} {statistics.median(values):9.2f} {min(values):6.2f} {max(values):6.2f}")


if __name__ == "__main__":
    main()
