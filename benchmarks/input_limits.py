"""Hostile inputs refused: wall time and peak memory of each refusal, each in a fresh ``rlplane`` process.

The "billion laughs" (nine anchors of nine aliases: 387 million values expanded) in rlplane's and NeMo RL's
format and as an override, a config of 20,000 values, one nested 50,000 deep, a sparse 4 GB config file,
``${...}`` that double a string 40 times, NeMo ``defaults:`` that fan out 8**5 ways, a JSONL file whose second
line never ends (64 MiB), a row nested 100,000 deep, 2.5 million rows past ``data.max_rows``. Each case must exit
2 with one ``rlplane: error:`` line naming its limit (else the benchmark stops); the figure is the median wall
time of ``--repeats`` runs and the largest peak RSS (``ru_maxrss`` of the process). The whole command is timed:
the interpreter's start and rlplane's imports included (for the data cases, torch's: the data is read after
the config is checked).

    python benchmarks/input_limits.py [--repeats 5] [--only NAME]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROW = '{"problem": "1+1=", "answer": "2"}\n'
TINY = ["warmup.enabled=false", "grpo.max_num_steps=1", "grpo.val_period=0", "grpo.val_at_start=false",
        "checkpointing.enabled=false", "logger.tensorboard_enabled=false"]


def laughs(nemo: bool) -> str:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    head = "grpo: {normalize_rewards: true}\n" if nemo else "defaults: grpo_arithmetic\n"
    return head + "\n".join(lines) + "\npolicy: {model_name: *a8}\n"


def build(d: Path) -> list[tuple[str, list[str], str]]:
    """(name, rlplane arguments, the limit its line must name) with their files under ``d``."""
    (d / "laughs.yaml").write_text(laughs(False))
    (d / "laughs_nemo.yaml").write_text(laughs(True))
    (d / "values.yaml").write_text("grpo: {x: [" + ", ".join(["1"] * 20_000) + "]}\n")
    (d / "deep.yaml").write_text("policy: " + "[" * 50_000 + "]" * 50_000 + "\n")
    with open(d / "sparse.yaml", "wb") as f:
        f.truncate(4 << 30)
    (d / "doubling.yaml").write_text("grpo: {normalize_rewards: true}\ns0: abcdefgh\n"
                                     + "".join(f"s{i}: ${{s{i - 1}}}${{s{i - 1}}}\n" for i in range(1, 41)))
    fan = d / "fan"
    fan.mkdir()
    for i in range(5):
        (fan / f"n{i}.yaml").write_text(f"defaults: [{', '.join([f'n{i + 1}.yaml'] * 8)}]\n")
    (fan / "n5.yaml").write_text("grpo: {normalize_rewards: true}\n")
    # Written a MiB at a time: the processes measured are forked from this one, and its memory counts in
    # their peak until they exec.
    with open(d / "endless.jsonl", "wb") as f:
        f.write(ROW.encode())
        for _ in range(64):
            f.write(b"x" * (1 << 20))
    (d / "nested.jsonl").write_text(ROW + '{"problem": "1+1=", "answer": "2", "x": ' + "[" * 100_000
                                    + "]" * 100_000 + "}\n")
    with open(d / "rows.jsonl", "w") as f:
        for _ in range(250):
            f.write(ROW * 10_000)
    bomb = "[&a [1,1,1,1,1,1,1,1,1], " + ", ".join(["[*a,*a,*a,*a,*a,*a,*a,*a,*a]"] * 400) + "]"
    j = ["data.dataset=jsonl"]
    return [
        ("billion laughs (rlplane YAML)", ["show-config", "-c", str(d / "laughs.yaml")], "MAX_CONFIG_VALUES"),
        ("billion laughs (NeMo RL YAML)", ["show-config", "-c", str(d / "laughs_nemo.yaml")], "MAX_CONFIG_VALUES"),
        ("billion laughs (an override)", ["show-config", f"grpo.x={bomb}"], "MAX_CONFIG_VALUES"),
        ("20,000 values", ["show-config", "-c", str(d / "values.yaml")], "MAX_CONFIG_VALUES"),
        ("nested 50,000 deep", ["show-config", "-c", str(d / "deep.yaml")], "MAX_CONFIG_DEPTH"),
        ("4 GB config file (sparse)", ["show-config", "-c", str(d / "sparse.yaml")], "MAX_CONFIG_BYTES"),
        ("${} doubling 40 times", ["show-config", "-c", str(d / "doubling.yaml")], "MAX_INTERPOLATION_STEPS"),
        ("defaults fan-out 8**5", ["show-config", "-c", str(fan / "n0.yaml")], "MAX_DEFAULTS_FILES"),
        ("JSONL line of 64 MiB", ["train", *TINY, *j, f"data.train.path={d / 'endless.jsonl'}",
                                  f"run_dir={d / 'r1'}"], "MAX_ROW_BYTES"),
        ("JSONL row nested 100,000 deep", ["train", *TINY, *j, f"data.train.path={d / 'nested.jsonl'}",
                                           f"run_dir={d / 'r2'}"], "MAX_ROW_DEPTH"),
        ("2.5 million rows (80 MB)", ["train", *TINY, *j, f"data.train.path={d / 'rows.jsonl'}",
                                      f"run_dir={d / 'r3'}"], "data.max_rows"),
    ]


def run_once(args: list[str], limit: str, cwd: Path) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes) of one refusal; exits the benchmark if it was not the one expected line."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "rlplane.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=cwd)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    lines = err.strip().splitlines()
    if os.waitstatus_to_exitcode(status) != 2 or len(lines) != 1 or limit not in lines[0]:
        sys.exit(f"{' '.join(args)[:200]}: not one line naming {limit}: {lines[:3]}")
    return seconds, usage.ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", help="run the cases whose name contains this")
    args = ap.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    with tempfile.TemporaryDirectory(prefix="rlplane-limits-") as tmp:
        cases = [c for c in build(Path(tmp)) if not args.only or args.only in c[0]]
        results: dict[str, list[tuple[float, int]]] = {name: [] for name, _, _ in cases}
        for _ in range(args.repeats):
            for name, argv, limit in cases:
                results[name].append(run_once(argv, limit, Path(tmp)))
    print(f"{'input':34s} {'median s':>9s} {'max s':>7s} {'peak RSS':>10s}   (repeats {args.repeats}, "
          f"load {os.getloadavg()[0]:.1f})")
    for name, runs in results.items():
        secs = [s for s, _ in runs]
        print(f"{name:34s} {statistics.median(secs):9.2f} {max(secs):7.2f} {max(r for _, r in runs) / 2**20:7.0f} MiB")


if __name__ == "__main__":
    main()
