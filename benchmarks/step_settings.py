"""The default job's GRPO step under several settings: median step, generation and training time per setting.

Each setting runs in its own process (thread counts and environment switches are per process): the default
job's config without warm-up (its embedded model from random weights: the same shapes, 32 prompts x 8 samples x
4 new tokens), ``--warmup-steps`` untimed GRPO steps, then ``--steps`` timed ones; the settings interleave over
``--rounds`` rounds so machine noise hits each alike. A setting is ``NAME=ITEM[,ITEM...]`` where an item is a
dotted config override (``policy.threads_per_worker=2``) or an environment variable (``env:OMP_WAIT_POLICY=ACTIVE``);
``NAME`` alone runs the config as it is. Prints the CPU's model and flags first.

    python benchmarks/step_settings.py [--rounds 3] [--steps 40] [--warmup-steps 5] \\
        auto 2threads=policy.threads_per_worker=2 bf16=policy.precision=bf16 active=env:OMP_WAIT_POLICY=ACTIVE
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = "--child"


def child(steps: int, warmup: int, overrides: list[str]) -> None:
    """One setting: print the median step / generation / training seconds as JSON."""
    from vs_trl import QUIET  # no validation, checkpoint or log file inside the timed steps

    from rlplane.config.loading import load_config
    from rlplane.recipes.grpo import grpo_step
    from rlplane.training import Session
    from rlplane.training.plan import skips_prev_logprob_forward
    from rlplane.workers.policy import ClippedPGLoss

    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(None, [*QUIET, "warmup.enabled=false", f"run_dir={tmp}",
                                 f"grpo.max_num_steps={steps + warmup}", *overrides])
        s = Session(cfg, quiet=True)
        try:
            s.start()
            loss = ClippedPGLoss(cfg.loss_fn.options(), reference=s.plan.needs_reference,
                                 prev_from_forward=skips_prev_logprob_forward(cfg))  # as recipes/grpo.train builds it
            rows = []
            for step in range(steps + warmup):
                t0 = time.perf_counter()
                s.begin_step(step)
                m = grpo_step(s, loss, step)
                s.log_step(s.trained(step), m)
                if step >= warmup:
                    rows.append((time.perf_counter() - t0, m["timing/train/generation"],
                                 m["timing/train/policy_training"]))
        finally:
            s.close()
    print(json.dumps([statistics.median(r[i] for r in rows) for i in range(3)]))


def parse(setting: str) -> tuple[str, list[str], dict[str, str]]:
    name, _, rest = setting.partition("=")
    overrides, env = [], {}
    for item in filter(None, rest.split(",")):
        if item.startswith("env:"):
            key, _, value = item[4:].partition("=")
            env[key] = value
        else:
            overrides.append(item)
    return name, overrides, env


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        child(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40, help="timed steps per setting and round")
    ap.add_argument("--warmup-steps", type=int, default=5, help="untimed steps first")
    ap.add_argument("settings", nargs="+", help="NAME or NAME=ITEM[,ITEM...] (see the module docstring)")
    args = ap.parse_args()
    from rlplane.utils.machine import describe_machine

    print(f"machine: {describe_machine()}; load average {os.getloadavg()[0]:.2f}", flush=True)
    settings = [parse(s) for s in args.settings]
    results: dict[str, list[list[float]]] = {name: [] for name, _, _ in settings}
    for r in range(args.rounds):
        for name, overrides, env in settings:
            cmd = [sys.executable, __file__, CHILD, str(args.steps), str(args.warmup_steps), *overrides]
            out = subprocess.run(cmd, capture_output=True, text=True,
                                 env={"OMP_WAIT_POLICY": "PASSIVE", **os.environ, **env})
            if out.returncode != 0:
                print(f"{name}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
                return 1
            step, gen, train = json.loads(out.stdout.strip().splitlines()[-1])
            results[name].append([step, gen, train])
            print(f"round {r + 1} {name}: step {1e3 * step:.1f} ms, generation {1e3 * gen:.1f}, training "
                  f"{1e3 * train:.1f}; load {os.getloadavg()[0]:.2f}", flush=True)
    base = statistics.median(x[0] for x in results[settings[0][0]])
    for name, _, _ in settings:
        med = [statistics.median(x[i] for x in results[name]) for i in range(3)]
        print(f"{name}: median step {1e3 * med[0]:.1f} ms (generation {1e3 * med[1]:.1f}, training "
              f"{1e3 * med[2]:.1f}); {med[0] / base:.3f}x of {settings[0][0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
