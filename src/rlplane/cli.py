"""The ``rlplane`` command: train | sft | eval | show-config.

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
    from rlplane.recipes.common import TrainingStopped

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
    cfg = _load(args)
    if cfg.algorithm == "ppo":
        from rlplane.recipes.ppo import train
    elif cfg.grpo.async_grpo.enabled:
        from rlplane.recipes.async_grpo import train
    else:
        from rlplane.recipes.grpo import train
    summary = train(cfg, quiet=args.quiet)
    before, after = summary["accuracy_before"], summary["accuracy_after"]
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    name = cfg.algorithm.upper()
    print(f"held-out accuracy before {name}: {fmt(before)}")
    print(f"held-out accuracy after {name}:  {fmt(after)}")
    print(f"run directory: {summary['run_dir']}  ({summary['wall_seconds']:.0f} s)")
    return 0


def cmd_sft(args) -> int:
    from rlplane.recipes.setup import build_session

    cfg = _load(args)
    s = build_session(cfg, quiet=args.quiet)
    try:
        state = s._warm_up()
        from rlplane.workers.base import load_configured_policy

        model, tok = load_configured_policy(cfg)
        model.load_state_dict(state)
        out = s.run_dir / "sft"
        model.save_pretrained(out)
        tok.save_pretrained(out)
        print(f"warm-up: {s.warmup_result['steps']} steps, held-out accuracy {s.warmup_result['accuracy']:.3f}")
        print(f"saved {out} (loads with AutoModelForCausalLM.from_pretrained)")
    finally:
        s.close()
    return 0


def cmd_eval(args) -> int:
    from pathlib import Path

    from rlplane.config.loading import ConfigError, load_config

    ckpt = Path(args.checkpoint)
    weights = ckpt / "policy" / "weights" if (ckpt / "policy" / "weights").is_dir() else ckpt
    if not (weights / "config.json").is_file():
        raise ConfigError([f"--checkpoint {ckpt}: no HF model there (expected {weights}/config.json); "
                           "pass a step_N checkpoint directory or an HF model directory"])
    preset = args.config or (str(ckpt / "config.yaml") if (ckpt / "config.yaml").is_file() else None)
    cfg = load_config(preset, [*args.overrides, f"policy.model_name={weights}", "warmup.enabled=false"])
    from rlplane.recipes.common import validate
    from rlplane.recipes.setup import build_session

    s = build_session(cfg.model_copy(update={"runtime": "local"}), quiet=True)
    try:
        s._start_workers(None)
        result = validate(s)
    finally:
        s.close()
    result["checkpoint"] = str(ckpt)
    result["num_problems"] = min(len(s.val_datums), cfg.loop.max_val_samples)
    print(json.dumps(result, indent=2))
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2))
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
    p = sub.add_parser("eval", help="held-out accuracy of a checkpoint (greedy; pass@k with grpo.val_num_generations_per_prompt)")
    p.add_argument("--checkpoint", required=True, help="a step_N checkpoint directory or an HF model directory")
    p.add_argument("--output", "-o", default=None, help="also write the result JSON here")
    _add_config_args(p)
    p.set_defaults(fn=cmd_eval)
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
