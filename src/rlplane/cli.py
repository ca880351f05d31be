"""The ``rlplane`` command: train | sft | eval | export | show-config.

Configs are a preset name or YAML path (``--config``) plus dotted overrides
(``grpo.num_prompts_per_step=16``). Mistakes a user can make end with one line per problem on
stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

def _user_errors() -> tuple[type[BaseException], ...]:
    from rlplane.config.loading import ConfigError
    from rlplane.data.errors import DatasetError
    from rlplane.dataplane import DataPlaneError
    from rlplane.envs import UnknownEnvironmentError
    from rlplane.models.loading import ModelLoadError
    from rlplane.training import TrainingStopped

    return (ConfigError, DatasetError, ModelLoadError, UnknownEnvironmentError, DataPlaneError, TrainingStopped)


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", default=None, help="preset name or YAML path (default: grpo_arithmetic)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. grpo.max_num_steps=50")


def _load(args):
    from rlplane.config.loading import load_config

    return load_config(args.config, args.overrides)


def cmd_show_config(args) -> int:
    from rlplane.config.loading import dump_config, list_presets

    if args.list:
        print("\n".join(list_presets()))
        return 0
    print(dump_config(_load(args)), end="")
    return 0


def cmd_train(args) -> int:
    from rlplane.config.recipes import recipe_for, train_function

    cfg = _load(args)
    summary = train_function(recipe_for(cfg))(cfg, quiet=args.quiet)
    before, after = summary["accuracy_before"], summary["accuracy_after"]
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    name = cfg.algorithm.upper()
    print(f"held-out accuracy before {name}: {fmt(before)}")
    print(f"held-out accuracy after {name}:  {fmt(after)}")
    print(f"run directory: {summary['run_dir']}  ({summary['wall_seconds']:.0f} s)")
    return 0


def cmd_sft(args) -> int:
    from pathlib import Path

    import torch

    from rlplane.training.prompts import Prompts
    from rlplane.training.warmup import warm_up
    from rlplane.utils.seeding import seed_everything
    from rlplane.workers.base import load_configured_policy

    cfg = _load(args)
    out = Path(cfg.run_dir) / "sft"
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(cfg.policy.threads_per_worker)
    seed_everything(cfg.loop.seed)
    model, tok = load_configured_policy(cfg)
    def say(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    state, result = warm_up(cfg, Prompts(cfg, tok), say)
    model.load_state_dict(state)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    print(f"warm-up: {result['steps']} steps, held-out accuracy {result['accuracy']:.3f}")
    print(f"saved {out} (loads with AutoModelForCausalLM.from_pretrained)")
    return 0


def _checkpoint_weights(path: str):
    """``(weights dir, checkpoint dir or None)`` for a run directory (its latest checkpoint), a
    ``step_N`` checkpoint, or a plain HF model directory."""
    from pathlib import Path

    from rlplane.config.loading import ConfigError
    from rlplane.utils.checkpoint import CheckpointManager

    p = Path(path)
    if not p.is_dir():
        raise ConfigError([f"--checkpoint {p}: no such directory; pass a run directory, a step_N checkpoint "
                           "or an HF model directory"])
    ckpt = p
    if (p / "checkpoints").is_dir():  # a run directory: its latest complete checkpoint
        ckpt = CheckpointManager(p / "checkpoints", None, "val:accuracy", True).latest() or p
    weights = ckpt / "policy" / "weights"
    if weights.is_dir() and (weights / "config.json").is_file():
        return weights, ckpt
    if (p / "config.json").is_file():
        return p, None
    raise ConfigError([f"--checkpoint {p}: no model there (expected checkpoints/step_N/policy/weights, "
                       "policy/weights or config.json); pass a run directory, a step_N checkpoint or an HF model directory"])


def _dataset_overrides(spec: str) -> list[str]:
    """``--dataset`` shorthand -> ``data.*`` overrides: ``arithmetic``, ``reasoning_gym:TASK[,TASK]``,
    or a file (``.jsonl`` read directly; ``.json``/``.parquet``/``.csv`` through HF datasets)."""
    from rlplane.config.loading import ConfigError

    if spec == "arithmetic":
        return ["data.dataset=arithmetic"]
    if spec.startswith("reasoning_gym"):
        tasks = spec.partition(":")[2] or "basic_arithmetic"
        return ["data.dataset=reasoning_gym", f"data.reasoning_gym.tasks=[{tasks}]"]
    if os.path.exists(spec) or "*" in spec:
        kind = "jsonl" if spec.endswith(".jsonl") else "hf"
        return [f"data.dataset={kind}", f"data.train.path={spec}", f"data.validation.path={spec}"]
    raise ConfigError([f"--dataset {spec!r}: not a file, 'arithmetic' or 'reasoning_gym:TASK'; "
                       "e.g. --dataset reasoning_gym:basic_arithmetic or --dataset problems.jsonl"])


def cmd_eval(args) -> int:
    from pathlib import Path

    from rlplane.config.loading import ConfigError, load_config
    from rlplane.evaluation import evaluate

    if bool(args.checkpoint) == bool(args.model):
        raise ConfigError(["rlplane eval: give exactly one of --checkpoint DIR or --model NAME"])
    overrides = []
    preset = args.config
    if args.checkpoint:
        weights, ckpt = _checkpoint_weights(args.checkpoint)
        saved = (ckpt / "config.yaml") if ckpt is not None else None
        if preset is None and saved is not None and saved.is_file():
            preset = str(saved)  # the run's own data, prompt format and environments
        overrides.append(f"policy.model_name={weights}")
    else:
        overrides.append(f"policy.model_name={args.model}")
    if args.dataset:
        overrides += _dataset_overrides(args.dataset)
    if args.seed is not None:
        # Evaluation draws no training problems; keep the two seeds distinct for the config check.
        overrides += [f"data.reasoning_gym.val_seed={args.seed}", f"data.reasoning_gym.train_seed={args.seed + 1}"]
    if args.max_new_tokens is not None:
        overrides.append(f"policy.generation.max_new_tokens={args.max_new_tokens}")
    cfg = load_config(preset, [*overrides, *args.overrides, "warmup.enabled=false", "runtime=local"])
    k = args.k if args.k is not None else cfg.loop.val_num_generations_per_prompt
    result = evaluate(cfg, num_problems=args.num_problems, k=k, batch_size=args.batch_size, progress=not args.quiet)
    if args.checkpoint:
        result["checkpoint"] = str(args.checkpoint)
    text = json.dumps(result, indent=2)
    print(text)
    line = f"accuracy (greedy): {result['accuracy']:.4f} on {result['num_problems']} problems"
    if k > 1:
        line += f"; pass@{k} (sampled, T={cfg.policy.generation.temperature:g}): {result[f'pass@{k}']:.4f}"
    print(f"{line}  ({result['wall_seconds']} s)", file=sys.stderr)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text + "\n")
    return 0


def cmd_export(args) -> int:
    """Copy a checkpoint's policy weights + tokenizer out as a plain HF model directory."""
    import shutil
    from pathlib import Path

    from rlplane.config.loading import ConfigError

    weights, ckpt = _checkpoint_weights(args.checkpoint)
    out = Path(args.output)
    if out.exists() and any(out.iterdir()):
        raise ConfigError([f"--output {out}: exists and is not empty; pick a new directory"])
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(weights, tmp)
    if out.exists():
        out.rmdir()
    tmp.rename(out)  # never a half-copied model under the final name
    where = f"{ckpt.name} of {ckpt.parent.parent}" if ckpt is not None else str(weights)
    print(f"exported {where} to {out} (loads with AutoModelForCausalLM.from_pretrained)")
    return 0


def cmd_plot(args) -> int:
    from pathlib import Path

    from rlplane.utils.plot import plot_runs

    output = args.output or (Path(args.run_dirs[0]) / "plot.png" if len(args.run_dirs) == 1 else "plot.png")
    png, page = plot_runs(args.run_dirs, output)
    print(f"wrote {png} and {page}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlplane", description="RL post-training of language models (GRPO, PPO).")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="warm-up + GRPO or PPO (the embedded arithmetic GRPO job by default)")
    _add_config_args(p)
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(fn=cmd_train)
    p = sub.add_parser("sft", help="only the supervised warm-up; saves an HF model to RUN_DIR/sft")
    _add_config_args(p)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(fn=cmd_sft)
    p = sub.add_parser("eval", help="held-out accuracy (greedy) and pass@k (sampled) of a checkpoint or model")
    p.add_argument("--checkpoint", default=None, help="a run directory (latest checkpoint), a step_N checkpoint or an HF model directory")
    p.add_argument("--model", default=None, help="a policy.model_name instead: packaged:smollm2-135m-instruct, embedded:tiny-llama, a directory")
    p.add_argument("--dataset", default=None,
                   help="arithmetic | reasoning_gym:TASK[,TASK] | FILE (.jsonl, .json, .parquet, .csv); default: the config's data")
    p.add_argument("--num-problems", "-n", type=int, default=None, help="held-out problems (default: max_val_samples)")
    p.add_argument("-k", type=int, default=None, help="sampled responses per problem for pass@k (default: val_num_generations_per_prompt)")
    p.add_argument("--seed", type=int, default=None, help="seed of the reasoning-gym held-out problems")
    p.add_argument("--max-new-tokens", type=int, default=None, help="response length cap")
    p.add_argument("--batch-size", type=int, default=16, help="problems per generation call")
    p.add_argument("--output", "-o", default=None, help="also write the result JSON here")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_config_args(p)
    p.set_defaults(fn=cmd_eval)
    p = sub.add_parser("export", help="copy a run's final checkpoint out as a plain HF model directory")
    p.add_argument("--checkpoint", required=True, help="a run directory (latest checkpoint) or a step_N checkpoint")
    p.add_argument("--output", "-o", required=True, help="the new model directory")
    p.set_defaults(fn=cmd_export)
    p = sub.add_parser("plot", help="PNG + HTML of runs' reward, accuracy, KL/entropy and step times, overlaid")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (their logs/metrics.jsonl)")
    p.add_argument("--output", "-o", default=None,
                   help="the PNG (default: RUN_DIR/plot.png, or ./plot.png for several)")
    p.set_defaults(fn=cmd_plot)
    p = sub.add_parser("show-config", help="print the resolved config")
    _add_config_args(p)
    p.add_argument("--list", action="store_true", help="list the presets")
    p.set_defaults(fn=cmd_show_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except _user_errors() as e:
        for line in str(e).splitlines():
            print(f"rlplane: error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rlplane: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
