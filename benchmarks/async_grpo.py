"""Sync vs async GRPO on the embedded arithmetic task, with a verifier that costs real time.

The environment is the exact-match arithmetic one wrapped so that every scoring call sleeps
``--judge-ms`` (100 ms by default): a stand-in for a code sandbox or a remote judge, whose latency
sync GRPO pays on every step and async GRPO hides behind training. ``--verifier long-tail`` makes
most calls fast (``--fast-ms``, 20) and about 1 in 10 (``--slow-share``) ten times slower
(``--slow-ms``, 200), as sandboxes are: which calls are slow follows from the seed and the call's
prompts, so sync and async, which score the same prompt batches, wait the same. Both runs start from the same
supervised warm-up (made once; ``--save-warm DIR`` keeps it for later invocations), take the same
number of steps with the same seed, and validate once at the end on the same held-out problems.

Throughput is trained samples over wall-clock time from the end of the first step to the end of
the last (start-up, the first step's warm-up of the pipeline and the final validation excluded;
logging between steps, during which an async collector keeps working, included). The summed step
timers (``timing/train/total_step_time``) leave out the few ms after each step's timer stops (the
async step's metrics, taken once the collector already generates again, and the logging), which
flattered async by ~2-5%; they are still printed beside it. Run it under the measurement lock:

    flock /tmp/rlplane-measure.lock python benchmarks/async_grpo.py [--steps 100] [--verifier long-tail]
        [--save-warm DIR] [--collector both] [KEY=VALUE ...]

The async run's collector runs in a thread of the trainer by default (the config's default);
``--collector process`` runs it in its own process (``grpo.async_grpo.collector_process``), ``both`` one
async run of each. The judge's latencies reach a collector process through environment variables.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

from rlplane.config.loading import load_config  # noqa: E402
from rlplane.envs import ArithmeticEnv, register_env  # noqa: E402
from rlplane.recipes import async_grpo, grpo  # noqa: E402
from rlplane.training.prompts import Prompts  # noqa: E402
from rlplane.training.session import Session  # noqa: E402
from rlplane.training.warmup import warm_up  # noqa: E402
from rlplane.utils.logging import read_metrics  # noqa: E402
from rlplane.workers.base import load_configured_policy  # noqa: E402


class SlowJudgeEnv(ArithmeticEnv):
    """Exact match, plus a fixed latency per scoring call (per batch, as a remote judge costs).
    The latency is read from the environment: a collector in its own process sees it too."""

    def step(self, message_logs, metadata):
        time.sleep(self.delay(message_logs))
        return super().step(message_logs, metadata)

    def delay(self, message_logs) -> float:
        return float(os.environ.get("RLPLANE_BENCH_JUDGE_MS", "100")) / 1e3


class LongTailJudgeEnv(SlowJudgeEnv):
    """Most scoring calls take ``--fast-ms``, a ``--slow-share`` of them ``--slow-ms`` (read from
    ``RLPLANE_BENCH_LONG_TAIL``). Which ones is drawn from ``--judge-seed`` and the batch's prompts
    (not from a call counter: the async collector also scores the groups of steps past the last, and
    validation interleaves), so sync and async, scoring the same prompt batches, get the same delays."""

    def delay(self, message_logs) -> float:
        fast_ms, slow_ms, slow_share, seed = os.environ.get("RLPLANE_BENCH_LONG_TAIL", "20,200,0.1,0").split(",")
        fast_s, slow_s, slow_share, seed = float(fast_ms) / 1e3, float(slow_ms) / 1e3, float(slow_share), int(seed)
        prompts = "\x1f".join(str(m.get("content", "")) for log in message_logs for m in log if m.get("role") == "user")
        slow = random.Random(f"{seed}\x1e{prompts}").random() < slow_share  # str seeds: sha512, stable
        return slow_s if slow else fast_s


def warm_start(base: list[str], save_dir: Path | None, tmp: Path) -> Path:
    """An HF directory with the SFT warm-up: loaded from ``save_dir`` if there, else made (and kept)."""
    if save_dir is not None and (save_dir / "config.json").is_file():
        print(f"warm start: {save_dir} (saved earlier)")
        return save_dir
    out = save_dir or tmp / "warm"
    cfg = load_config(None, [*base, f"run_dir={tmp / 'sft'}"])
    model, tok = load_configured_policy(cfg)
    state, result = warm_up(cfg, Prompts(cfg, tok), lambda msg: None)
    model.load_state_dict(state)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    print(f"warm start: supervised warm-up, {result['steps']} steps, held-out accuracy "
          f"{result['accuracy']:.3f} -> {out}")
    return out


@contextlib.contextmanager
def step_ends() -> Iterator[list[float]]:
    """The wall-clock time (perf_counter) at which each step's work ends: the entry of
    ``Session.end_step``, before that step's logging, validation and checkpoint."""
    ends: list[float] = []
    end_step = Session.end_step

    def timed(self, step, metrics):
        ends.append(time.perf_counter())
        return end_step(self, step, metrics)

    Session.end_step = timed
    try:
        yield ends
    finally:
        Session.end_step = end_step


def run(name: str, train, overrides: list[str], run_dir: Path) -> dict[str, float]:
    cfg = load_config(None, [*overrides, f"run_dir={run_dir}"])
    t0 = time.perf_counter()
    with step_ends() as ends:
        summary = train(cfg, quiet=True)
    wall = time.perf_counter() - t0
    rows = [r for r in read_metrics(run_dir / "logs") if r["step"] > 0]
    g = cfg.grpo
    per_step = g.num_prompts_per_step * g.num_generations_per_prompt
    step_s = sum(r["timing/train/total_step_time"] for r in rows)
    out = {
        # Steps 2..N over the wall time they took (the first step fills the pipeline).
        "samples_per_s": (len(ends) - 1) * per_step / (ends[-1] - ends[0]),
        "summed_samples_per_s": len(rows) * per_step / step_s,
        "median_step_ms": 1e3 * statistics.median(r["timing/train/total_step_time"] for r in rows),
        "accuracy": summary["accuracy_after"],
        "wall_s": wall,
    }
    # The trainer's phases, then (async) the collector's seconds per step: generation, scoring, score_wait.
    phases = sorted({k for r in rows for k in r if k.startswith("timing/train/")}) + \
        sorted({k for r in rows for k in r if k.startswith("timing/collector/")})
    out["phases_ms"] = {k.removeprefix("timing/train/").removeprefix("timing/"):
                        1e3 * sum(r.get(k, 0.0) for r in rows) / len(rows) for k in phases}
    ages = [r["train/avg_trajectory_age"] for r in rows if "train/avg_trajectory_age" in r]
    if ages:
        out["mean_age"] = sum(ages) / len(ages)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100, help="GRPO steps of each run")
    ap.add_argument("--verifier", choices=["fixed", "long-tail"], default="fixed",
                    help="fixed: every scoring call takes --judge-ms; "
                         "long-tail: --fast-ms, a --slow-share of calls --slow-ms")
    ap.add_argument("--judge-ms", type=float, default=100.0, help="latency of one scoring call (--verifier fixed)")
    ap.add_argument("--fast-ms", type=float, default=20.0, help="latency of most scoring calls (--verifier long-tail)")
    ap.add_argument("--slow-ms", type=float, default=200.0, help="latency of the slow calls (--verifier long-tail)")
    ap.add_argument("--slow-share", type=float, default=0.1, help="share of slow calls (--verifier long-tail)")
    ap.add_argument("--judge-seed", type=int, default=0, help="which calls are slow (--verifier long-tail)")
    ap.add_argument("--max-age", type=int, default=1, help="grpo.async_grpo.max_trajectory_age_steps")
    ap.add_argument("--save-warm", type=Path, default=None, help="keep (or reuse) the warm-up model here")
    ap.add_argument("--collector", choices=["process", "thread", "both"], default="thread",
                    help="the async collector in its own process (grpo.async_grpo.collector_process=true), in a "
                         "thread of the trainer's, or one async run of each after the sync run")
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE for both runs")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not 0.0 <= args.slow_share <= 1.0:
        ap.error(f"--slow-share {args.slow_share}: a share of calls, between 0 and 1 (e.g. 0.1)")
    os.environ["RLPLANE_BENCH_JUDGE_MS"] = str(args.judge_ms)
    os.environ["RLPLANE_BENCH_LONG_TAIL"] = f"{args.fast_ms},{args.slow_ms},{args.slow_share},{args.judge_seed}"
    judge = LongTailJudgeEnv if args.verifier == "long-tail" else SlowJudgeEnv
    register_env("arithmetic", judge)  # the task's samples now go to the slow judge (runtime: local)
    quiet = ["logger.progress_bar=false", "logger.tensorboard_enabled=false", "checkpointing.enabled=false"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        warm = warm_start([*quiet, *args.overrides], args.save_warm, tmp)
        common = [*quiet, f"policy.model_name={warm}", "warmup.enabled=false", f"grpo.max_num_steps={args.steps}",
                  "grpo.val_period=0", "grpo.val_at_start=false", "grpo.val_at_end=true", "runtime=local",
                  *args.overrides]
        sync = run("sync", grpo.train, common, tmp / "sync")
        modes = ["process", "thread"] if args.collector == "both" else [args.collector]
        asyncs = {mode: run("async", async_grpo.train, [
            *common, "grpo.async_grpo.enabled=true", f"grpo.async_grpo.max_trajectory_age_steps={args.max_age}",
            "loss_fn.use_importance_sampling_correction=true",
            f"grpo.async_grpo.collector_process={str(mode == 'process').lower()}"], tmp / f"async-{mode}")
            for mode in modes}
    cfg = load_config(None, common)
    g = cfg.grpo
    if args.verifier == "long-tail":
        judge_text = (f"long-tail judge {args.fast_ms:.0f} ms/call, {args.slow_share:.0%} of calls "
                      f"{args.slow_ms:.0f} ms (seed {args.judge_seed})")
    else:
        judge_text = f"judge {args.judge_ms:.0f} ms/call"
    print(f"{args.steps} steps of {g.num_prompts_per_step}x{g.num_generations_per_prompt} samples, {judge_text}, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    runs = {"sync": sync, **{f"async ({mode} collector)": r for mode, r in asyncs.items()}}
    for name, r in runs.items():
        age = f", mean trajectory age {r['mean_age']:.2f}" if "mean_age" in r else ""
        print(f"{name} GRPO: {r['samples_per_s']:7.1f} samples/s wall-clock ({r['summed_samples_per_s']:.1f} by the "
              f"summed step timers; median step {r['median_step_ms']:.0f} ms), "
              f"held-out accuracy {r['accuracy']:.3f}{age}")
    for mode, asyn in asyncs.items():
        ratio = asyn['samples_per_s'] / sync['samples_per_s']
        print(f"async / sync throughput ({mode} collector): {ratio:.2f}x wall-clock "
              f"({asyn['summed_samples_per_s'] / sync['summed_samples_per_s']:.2f}x by the summed step timers); "
              f"accuracy difference (async - sync): {asyn['accuracy'] - sync['accuracy']:+.3f}")
    for name, r in runs.items():
        print(f"{name} mean ms per step: " + ", ".join(f"{k} {v:.0f}" for k, v in r["phases_ms"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
