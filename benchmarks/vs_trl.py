"""rlplane's GRPO beside TRL's ``GRPOTrainer`` on identical work: ms per step and held-out accuracy.

Both start from the same weights: rlplane's supervised warm-up of the default job runs once, the
warm-started model is saved as a Hugging Face directory, and each run loads it. Both train on the
same prompt stream (the default job's training loader, in its order: TRL gets those rows as its
dataset with ``shuffle_dataset=False``), 32 prompts x 8 samples, AdamW lr 2e-4 constant, weight decay
0, grad clip 1.0, ratio clip 0.2, no KL (beta 0), temperature 1, no top-k/top-p, 4 new tokens, fp32,
one optimizer step per rollout, the same reward (rlplane's ``arithmetic`` environment) and the same
threads. The loss aggregation is the same (token mean over the global batch: TRL's ``dapo``), and so
is the advantage: the group's mean as baseline, divided by the group's (Bessel) std plus a small
epsilon (TRL's ``scale_rewards="group"``, 1e-4; rlplane with
``grpo.adv_estimator.use_leave_one_out_baseline=false``, 1e-6; all-equal groups get 0 in both).
Each library computes that work its own way: rlplane as its default job does (the training forward
runs each group's prompt once, ``policy.shared_prefix_forward``, with eager attention,
``policy.attn_implementation``: the same logprobs and gradients up to float rounding), TRL with its
defaults (every row's prompt recomputed) and, unless ``--trl-attn sdpa``, the same eager attention,
so the attention kernel is not what the ratio measures.
``--rlplane-loo`` runs rlplane with the default job's own estimator instead (leave-one-out baseline
and std), which differs from TRL's: a group's lone correct sample gets advantage 1 there against
(1 - 1/8) / std = 2.47 in TRL's.

Step time: rlplane, a step of ``recipes/grpo.train``'s loop (``begin_step``, ``grpo_step``,
``log_step``: prompts, generation, scoring, logprobs, advantages, training, logging; no validation or
checkpoint is due); TRL, the interval between consecutive ``on_step_end`` callbacks (dataloader,
generation, scoring, forward/backward, clip, optimizer, logging). Both as wall time and as the
process's CPU time over the same interval (all its threads; both run in this one process): the CPU
ratio is the steadier one on a shared machine whose load changes from run to run. Held-out
accuracy for both: rlplane's greedy evaluation (``validate``) on the default job's 500 held-out
problems, run on each final model by the same code; evaluation is outside every timing.
Runs alternate (rlplane, TRL), (TRL, rlplane), ... so machine noise hits both alike.

    pip install 'rlplane[bench]'          # trl
    python benchmarks/vs_trl.py [--steps 200] [--pairs 3] [--threads N] [--rlplane-threads N|auto] [--warm-dir DIR]
                                [--rlplane-loo]

``--rlplane-threads auto`` leaves rlplane's thread count to rlplane (one thread for the embedded model, which is
narrower than ``rlplane.fast.threads.MIN_THREADED_HIDDEN``) while TRL keeps ``--threads``: each library as a user
runs it.
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
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from rlplane.config.loading import load_config  # noqa: E402
from rlplane.datasets import build_datasets  # noqa: E402
from rlplane.envs import create_env  # noqa: E402
from rlplane.fast.threads import available_cores  # noqa: E402
from rlplane.recipes.grpo import grpo_step  # noqa: E402
from rlplane.training import Session  # noqa: E402
from rlplane.training.plan import skips_prev_logprob_forward  # noqa: E402
from rlplane.workers.policy import ClippedPGLoss  # noqa: E402

# No validation inside a run (the benchmark evaluates each final model itself, outside every timing).
QUIET = ["checkpointing.enabled=false", "logger.progress_bar=false", "logger.tensorboard_enabled=false",
         "logger.jsonl_enabled=false", "grpo.val_at_start=false", "grpo.val_period=0", "grpo.val_at_end=false"]


def rlplane_config(run_dir: str, threads: int | None, *extra: str):
    """The default job's config for a benchmark run; ``threads`` None: rlplane picks its own thread count."""
    threads_key = [] if threads is None else [f"policy.threads_per_worker={threads}"]
    return load_config(None, [*QUIET, f"run_dir={run_dir}", *threads_key, *extra])


def warm_start(out_dir: str, threads: int) -> float:
    """rlplane's supervised warm-up of the default job, saved as an HF model in ``out_dir``; returns
    the warm-up's held-out accuracy."""
    with tempfile.TemporaryDirectory() as tmp:
        s = Session(rlplane_config(tmp, threads), quiet=True)
        try:
            s.start()
            w = s.workers.policy.workers[0]
            w.model.save_pretrained(out_dir, safe_serialization=True)
            w.tokenizer.save_pretrained(out_dir)
            return float(s.warmup_result.get("accuracy", float("nan")))
        finally:
            s.close()


class Evaluator:
    """rlplane's greedy held-out evaluation of any state dict of the warm-started model's shape."""

    def __init__(self, warm_dir: str, threads: int):
        self.tmp = tempfile.TemporaryDirectory()
        cfg = rlplane_config(self.tmp.name, threads, "warmup.enabled=false", f"policy.model_name={warm_dir}")
        self.s = Session(cfg, quiet=True)
        self.s.start()
        self.model = self.s.workers.policy.workers[0].model  # the hf generator samples from this very module

    def accuracy(self, state: dict[str, torch.Tensor]) -> float:
        self.model.load_state_dict(state)
        self.model.eval()
        return self.s.validate()["validation/accuracy"]

    def close(self):
        self.s.close()
        self.tmp.cleanup()


# TRL's GRPO advantage (group mean baseline, group std): see the module docstring.
SAME_ADVANTAGE = ["grpo.adv_estimator.use_leave_one_out_baseline=false"]


def run_rlplane(warm_dir: str, steps: int, threads: int | None,
                loo: bool = False) -> tuple[list[float], dict[str, torch.Tensor], dict]:
    """``steps`` GRPO steps of the default job from the warm-started weights (TRL's advantage unless
    ``loo``); ((step seconds, step CPU seconds), final weights, median phase times)."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = rlplane_config(tmp, threads, "warmup.enabled=false", f"policy.model_name={warm_dir}",
                             f"grpo.max_num_steps={steps}", *([] if loo else SAME_ADVANTAGE))
        s = Session(cfg, quiet=True)
        try:
            s.start()
            # As recipes/grpo.train builds it.
            loss = ClippedPGLoss(cfg.loss_fn.options(), reference=s.plan.needs_reference,
                                 prev_from_forward=skips_prev_logprob_forward(cfg))
            times, cpu, phases = [], [], []
            for step in range(steps):
                t0, c0 = time.perf_counter(), time.process_time()
                s.begin_step(step)  # as recipes/grpo.train does before each step
                m = grpo_step(s, loss, step)
                s.log_step(s.trained(step), m)  # logging (the run's files); no validation or checkpoint is due
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
                phases.append({k.removeprefix("timing/train/"): v for k,
                               v in m.items() if k.startswith("timing/train/")})
            state = {k: v.detach().clone() for k, v in s.workers.policy.workers[0].get_weights().items()}
        finally:
            s.close()
    return (times, cpu), state, {k: statistics.median(p[k] for p in phases) for k in phases[0]}


def prompt_rows(warm_dir: str, steps: int, threads: int) -> list[dict]:
    """The default job's first ``steps`` training batches, in order, as TRL dataset rows."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = rlplane_config(tmp, threads, "warmup.enabled=false", f"policy.model_name={warm_dir}")
        from rlplane.models.configured import load_configured_policy

        _, tok = load_configured_policy(cfg.policy, cfg.loop.seed)
        loader, _, _ = build_datasets(cfg.dataset_options(), tok)
    rows, it = [], iter(loader)
    for _ in range(steps):
        for d in next(it):
            rows.append({"prompt": d.message_log[0]["content"], "ground_truth": d.extra_env_info["ground_truth"],
                         "prompt_ids": d.message_log[0]["token_ids"]})
    return rows


def run_trl(warm_dir: str, rows: list[dict], steps: int, threads: int, lr: float, out_dir: str, attn: str):
    """TRL's GRPOTrainer on the same rows from the same weights; (step seconds, final weights)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(threads)
    env = create_env("arithmetic")

    def reward(prompts, completions, ground_truth, **_):
        logs = [[{"role": "user", "content": p}, {"role": "assistant", "content": c}] for p,
                c in zip(prompts, completions)]
        return [float(r) for r in env.step(logs, [{"ground_truth": g} for g in ground_truth]).rewards]

    class StepTimes(TrainerCallback):
        def __init__(self):
            self.ends: list[float] = []
            self.cpu_ends: list[float] = []

        def on_train_begin(self, *a, **k):
            self.ends.append(time.perf_counter())
            self.cpu_ends.append(time.process_time())

        def on_step_end(self, *a, **k):
            self.ends.append(time.perf_counter())
            self.cpu_ends.append(time.process_time())

    args = GRPOConfig(
        output_dir=out_dir, max_steps=steps, per_device_train_batch_size=256, num_generations=8,
        gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1, shuffle_dataset=False,
        temperature=1.0, top_k=0, top_p=1.0, max_completion_length=4, use_vllm=False,
        beta=0.0, epsilon=0.2, loss_type="dapo", scale_rewards="group",
        learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch", weight_decay=0.0,
        max_grad_norm=1.0, bf16=False, fp16=False, gradient_checkpointing=False, use_cpu=True,
        report_to="none", save_strategy="no", logging_steps=10**9, disable_tqdm=True, seed=42,
    )
    tok = AutoTokenizer.from_pretrained(warm_dir)
    # TRL tokenizes the prompt text itself (special tokens on): check it sees rlplane's prompt ids.
    got = tok(rows[0]["prompt"], add_special_tokens=True)["input_ids"]
    if got != rows[0]["prompt_ids"]:
        raise RuntimeError(f"TRL would tokenize {rows[0]['prompt']!r} as {got}, rlplane as {rows[0]['prompt_ids']}")
    model = AutoModelForCausalLM.from_pretrained(warm_dir, dtype=torch.float32, attn_implementation=attn)
    timer = StepTimes()
    data = Dataset.from_list([{"prompt": r["prompt"], "ground_truth": r["ground_truth"]} for r in rows])
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=data,
                          processing_class=tok, callbacks=[timer])
    trainer.remove_callback(PrinterCallback)  # its end-of-run metrics dict is not this benchmark's output
    trainer.train()
    state = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    times = [b - a for a, b in zip(timer.ends, timer.ends[1:])]
    cpu = [b - a for a, b in zip(timer.cpu_ends, timer.cpu_ends[1:])]
    return (times, cpu), state


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="GRPO steps per run")
    ap.add_argument("--pairs", type=int, default=3, help="(rlplane, TRL) pairs, alternating which goes first")
    ap.add_argument("--threads", type=int, default=available_cores(),
                    help="torch threads for both (default: the cores, as rlplane's default job uses)")
    ap.add_argument("--rlplane-threads", default=None,
                    help="rlplane's torch threads: a number, or auto (its own choice: policy.threads_per_worker "
                         "unset); default: --threads, as TRL's")
    ap.add_argument("--warm-dir", default=None, help="reuse a warm-started model saved by an earlier run")
    ap.add_argument("--trl-attn", default="eager", choices=["eager", "sdpa"],
                    help="TRL's attention (default eager, as rlplane's default job; sdpa is transformers' default)")
    ap.add_argument("--rlplane-loo", action="store_true",
                    help="rlplane with the default job's leave-one-out advantage instead of TRL's group mean/std")
    args = ap.parse_args()
    rl_threads = args.threads if args.rlplane_threads is None else (
        None if args.rlplane_threads == "auto" else int(args.rlplane_threads))
    import transformers

    transformers.utils.logging.disable_progress_bar()
    try:
        import trl
    except ImportError:
        print("benchmarks/vs_trl.py needs TRL: pip install 'rlplane[bench]'", file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory() as tmp:
        warm_dir = args.warm_dir or os.path.join(tmp, "warm")
        if args.warm_dir is None or not os.path.isfile(os.path.join(warm_dir, "config.json")):
            t0 = time.perf_counter()
            acc = warm_start(warm_dir, args.threads)
            print(f"warm-up (rlplane's default job): held-out accuracy {acc:.3f}, "
                  f"{time.perf_counter() - t0:.0f} s; saved to {warm_dir}", flush=True)
        cfg = rlplane_config(tmp, args.threads, "warmup.enabled=false", f"policy.model_name={warm_dir}")
        evaluator = Evaluator(warm_dir, args.threads)
        rows = prompt_rows(warm_dir, args.steps, args.threads)
        start_state = {k: v.clone() for k, v in evaluator.model.state_dict().items()}
        start_acc = evaluator.accuracy(start_state)
        rl_threads_said = "its own choice" if rl_threads is None else rl_threads
        print(f"trl {trl.__version__}, torch {torch.__version__}; threads: TRL {args.threads}, rlplane "
              f"{rl_threads_said}; "
              f"{args.steps} steps x {args.pairs} pairs; TRL attention {args.trl_attn}; "
              f"32 prompts x 8 samples; load average "
              f"{os.getloadavg()[0]:.2f}; rlplane skips the prev-logprob forward: {skips_prev_logprob_forward(cfg)}; "
              f"rlplane's advantage: {'leave-one-out (its own)' if args.rlplane_loo else 'group mean/std (as TRL)'}")
        print("held-out accuracy of the warm-started model "
              f"({cfg.grpo.max_val_samples} problems, greedy): {start_acc:.3f}", flush=True)
        results = {"rlplane": [], "trl": []}
        for pair in range(args.pairs):
            order = ["rlplane", "trl"] if pair % 2 == 0 else ["trl", "rlplane"]
            for who in order:
                if who == "rlplane":
                    (times, cpu), state, phases = run_rlplane(warm_dir, args.steps, rl_threads, args.rlplane_loo)
                    torch.set_num_threads(args.threads)
                else:
                    (times, cpu), state = run_trl(warm_dir, rows, args.steps, args.threads, cfg.policy.optimizer.lr,
                                           os.path.join(tmp, f"trl{pair}"), args.trl_attn)
                    torch.set_num_threads(args.threads)
                    phases = {}
                acc = evaluator.accuracy(state)
                ms, cpu_ms = statistics.median(times) * 1e3, statistics.median(cpu) * 1e3
                results[who].append((ms, acc, cpu_ms))
                extra = "  phases (median ms): " + ", ".join(f"{k} {v * 1e3:.1f}" for k,
                                                             v in phases.items()) if phases else ""
                print(f"pair {pair + 1} {who:7s}: median {ms:6.1f} ms/step over {len(times)} steps "
                      f"(p10 {1e3 * sorted(times)[len(times) // 10]:.1f}, p90 "
                      f"{1e3 * sorted(times)[9 * len(times) // 10]:.1f}; CPU {cpu_ms:.1f}), "
                      f"held-out accuracy {acc:.3f}; load {os.getloadavg()[0]:.2f}{extra}", flush=True)
        evaluator.close()
    ratios = [r[0] / t[0] for r, t in zip(results["rlplane"], results["trl"])]
    print("ratio rlplane / TRL in ms per step, per pair: " + ", ".join(f"{x:.3f}" for x in ratios))
    print(f"median ms/step: rlplane {statistics.median(r[0] for r in results['rlplane']):.1f}, "
          f"TRL {statistics.median(t[0] for t in results['trl']):.1f}; "
          f"held-out accuracy rlplane {', '.join(f'{r[1]:.3f}' for r in results['rlplane'])} | "
          f"TRL {', '.join(f'{t[1]:.3f}' for t in results['trl'])} (from {start_acc:.3f})")
    # CPU time of the process per step: what each library itself costs, far less moved by other
    # programs' load than wall time (a pair whose load changed between its two runs skews the wall ratio).
    cpu_ratios = [r[2] / t[2] for r, t in zip(results["rlplane"], results["trl"])]
    print("ratio rlplane / TRL in CPU ms per step, per pair: " + ", ".join(f"{x:.3f}" for x in cpu_ratios)
          + f"; median {statistics.median(cpu_ratios):.3f}")
    print(f"ratio rlplane / TRL: {statistics.median(ratios):.3f} (median of {len(ratios)} pairs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
