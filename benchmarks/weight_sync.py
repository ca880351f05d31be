"""The default job's step time with weight-sync verification on and off, measured in the same run.

Two sessions of the default job (warm-up off, no validation or checkpoints) side by side in this
process, one with ``policy.generation.verify_weights=fail`` and one with ``off``; their steps
interleave (on, off, on, ...) so machine noise hits both alike. Each round times ``--steps`` steps of
each after ``--warmup-steps`` untimed ones; the ratio of a round is its mean step on / off (the mean: the
probe runs at every ``verify_probe_every``-th step only), and the figure is the median over ``--rounds``
rounds. Also timed: the check itself (``timing/weight_sync/check``), mean per step.

    python benchmarks/weight_sync.py [--steps 30] [--warmup-steps 3] [--rounds 3] [KEY=VALUE overrides...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from rlplane.config.loading import load_config  # noqa: E402
from rlplane.recipes.grpo import grpo_step  # noqa: E402
from rlplane.training import Session  # noqa: E402
from rlplane.training.plan import skips_prev_logprob_forward  # noqa: E402
from rlplane.workers.policy import ClippedPGLoss  # noqa: E402

MODES = ("fail", "off")


def session(tmp: str, mode: str, overrides: list[str]) -> tuple[Session, ClippedPGLoss]:
    cfg = load_config(None, ["warmup.enabled=false", "checkpointing.enabled=false", "logger.progress_bar=false",
                             "logger.tensorboard_enabled=false", "grpo.val_period=0", "grpo.val_at_start=false",
                             "grpo.val_at_end=false", f"run_dir={tmp}/{mode}",
                             f"policy.generation.verify_weights={mode}",
                             *overrides])
    s = Session(cfg, quiet=True)
    s.start()
    return s, ClippedPGLoss(cfg.loss_fn.options(), reference=s.plan.needs_reference,
                            prev_from_forward=skips_prev_logprob_forward(cfg))


def one_round(tmp: str, args) -> dict:
    """Mean step seconds of each mode over ``args.steps`` interleaved steps, and the check's mean seconds per step."""
    runs = {mode: session(tmp, mode, args.overrides) for mode in MODES}
    times = {mode: [] for mode in MODES}
    checks = []
    try:
        for step in range(args.warmup_steps + args.steps):
            for mode, (s, loss) in runs.items():
                t0 = time.perf_counter()
                s.begin_step(step)
                metrics = grpo_step(s, loss, step)
                done = s.trained(step)  # the end-of-step jobs, as recipes/grpo.train runs them
                s.validate_if_due(done, metrics)
                s.log_step(done, metrics)
                s.checkpoint_if_due(done, metrics)
                if step >= args.warmup_steps:
                    times[mode].append(time.perf_counter() - t0)
                    if mode == "fail":
                        checks.append(metrics.get("timing/weight_sync/check", 0.0))
    finally:
        for s, _ in runs.values():
            s.close()
    out = {mode: statistics.mean(t) for mode, t in times.items()}
    out["check"] = statistics.mean(checks)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30, help="timed steps of each mode per round")
    ap.add_argument("--warmup-steps", type=int, default=3, help="untimed steps of each mode first")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; the ratio reported is their median")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rounds = []
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            rounds.append(one_round(tmp, args))
        on, off, check = rounds[-1]["fail"], rounds[-1]["off"], rounds[-1]["check"]
        print(f"round {r}: step on {on * 1e3:.1f} ms, off {off * 1e3:.1f} ms, ratio {on / off:.4f}; "
              f"check {check * 1e3:.2f} ms")
    ratio = statistics.median(x["fail"] / x["off"] for x in rounds)
    check = statistics.median(x["check"] for x in rounds)
    off = statistics.median(x["off"] for x in rounds)
    print(f"load average: {os.getloadavg()[0]:.2f}; default job (warm-up off), {args.steps} timed steps per mode "
          f"per round, interleaved, {args.rounds} rounds")
    print(f"verification on / off: median ratio {ratio:.4f} ({(ratio - 1) * 100:+.2f}%); check {check * 1e3:.2f} ms "
          f"per step = {check / off * 100:.2f}% of the mean step ({off * 1e3:.1f} ms off)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
