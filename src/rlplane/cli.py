"""The ``rlplane`` command: train | sft | eval | export | plot | sweep | show-config; user mistakes exit 2 with one
line each."""

from __future__ import annotations

import argparse
import errno
import io
import json
import os
import sys
from contextlib import contextmanager, redirect_stdout

from rlplane.checkpoint_source import checkpoint_weights

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

# The errors a user can cause, by the module that defines each. A class whose module was never imported cannot
# have been raised, so only imported ones are caught: printing a config mistake imports no torch.
USER_ERRORS = (
    ("rlplane.errors", "ConfigError"), ("rlplane.data.errors", "DatasetError"),
    ("rlplane.models.loading", "ModelLoadError"), ("rlplane.envs.registry", "UnknownEnvironmentError"),
    ("rlplane.dataplane.errors", "DataPlaneError"), ("rlplane.training.loop", "TrainingStopped"),
    ("rlplane.utils.checkpoint", "CheckpointError"), ("rlplane.runtime.deadlines", "DeadlineExceeded"),
    ("rlplane.envs.sandbox", "SandboxUnavailable"), ("rlplane.errors", "WorkerFailed"),
)


def _user_errors() -> tuple[type[BaseException], ...]:
    return tuple(getattr(sys.modules[module], name) for module, name in USER_ERRORS if module in sys.modules)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one ``rlplane: error:`` line (exit 2) like every other one."""

    def error(self, message: str):
        sub = self.prog.split(" ", 1)[1] if " " in self.prog else ""
        print(f"rlplane: error: {self.prog}: {message}; see rlplane {sub + ' ' if sub else ''}--help", file=sys.stderr)
        sys.exit(2)


def _at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", default=None, help="preset name or YAML path (default: grpo_arithmetic)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. grpo.max_num_steps=50")


def _load(args):
    from rlplane.config.loading import load_config

    return load_config(args.config, args.overrides)


def _check_data_files(cfg) -> None:
    """Data files past a bound (a line, the rows) are said with the config, before a run's imports."""
    from rlplane.data.file_bounds import check_data_files

    check_data_files(cfg.data)


def cmd_show_config(args) -> int:
    from rlplane.config.loading import dump_config, list_presets

    if args.list:
        print("\n".join(list_presets()))
        return 0
    print(dump_config(_load(args)), end="")
    return 0


@contextmanager
def _prepared_run(cfg, args):
    """Check the run's paths, lock run_dir for the command's life, and with --overwrite remove the earlier run."""
    from rlplane.utils.run_dir import prepare_run_paths, release_run_dir

    paths = prepare_run_paths(cfg, overwrite=args.overwrite)
    try:
        yield paths
    finally:
        release_run_dir(paths.run_dir)


def cmd_train(args) -> int:
    from rlplane.config.recipes import recipe_for, train_function
    from rlplane.runtime.interrupts import StopSignals

    if args.early_stop:  # before the user's overrides: early_stop.* given there win
        args.overrides = ["early_stop.enabled=true", *args.overrides]
    cfg = _load(args)
    _check_data_files(cfg)
    # SIGINT / SIGTERM / SIGHUP: the run stops after the step in progress.
    with _prepared_run(cfg, args), StopSignals().installed() as signals:
        summary = train_function(recipe_for(cfg))(cfg, quiet=args.quiet, signals=signals)
    before, after = summary["accuracy_before"], summary["accuracy_after"]
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    name = cfg.algorithm.upper()
    print(f"held-out accuracy before {name}: {fmt(before)}")
    print(f"held-out accuracy after {name}:  {fmt(after)}")
    if stopped := summary.get("stopped_early"):
        print(f"stopped early after step {stopped['after_step']}: {stopped['reason']}")
    print(f"run directory: {summary['run_dir']}  ({summary['wall_seconds']:.0f} s)")
    from rlplane.sweeps.expected import end_of_run_lines

    for line in end_of_run_lines(cfg, before, after):
        print(line)
    return 0


def cmd_sft(args) -> int:
    cfg = _load(args)
    _check_data_files(cfg)
    with _prepared_run(cfg, args) as paths:
        return _sft(cfg, args, paths)


def _sft(cfg, args, paths) -> int:
    from rlplane.config.loading import dump_config
    from rlplane.fast.threads import set_worker_threads
    from rlplane.models.configured import load_configured_policy
    from rlplane.models.precision import hidden_size_of
    from rlplane.training.plan import rollout_options
    from rlplane.training.prompts import Prompts
    from rlplane.training.warmup import warm_up
    from rlplane.utils.seeding import seed_everything

    out = paths.run_dir / "sft"
    seed_everything(cfg.loop.seed)
    model, tok = load_configured_policy(cfg.policy, cfg.loop.seed)
    set_worker_threads(cfg.policy.threads_per_worker, hidden_size_of(model))

    def say(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    state, result = warm_up(rollout_options(cfg), cfg.warmup, cfg.env, Prompts(cfg.dataset_options(), tok), say)
    (paths.run_dir / "config.yaml").write_text(dump_config(cfg))  # written once the run really ran
    model.load_state_dict(state)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    print(f"warm-up: {result['steps']} steps, held-out accuracy {result['accuracy']:.3f}")
    print(f"saved {out} (loads with AutoModelForCausalLM.from_pretrained)")
    return 0


def _dataset_overrides(spec: str) -> list[str]:
    """``--dataset`` shorthand -> ``data.*`` overrides: ``arithmetic``, ``reasoning_gym:TASK[,TASK]``,
    or a file (``.jsonl`` read directly; ``.json``/``.parquet``/``.csv`` through HF datasets)."""
    from rlplane.errors import ConfigError

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

    from rlplane.config.loading import load_config
    from rlplane.errors import ConfigError

    if bool(args.checkpoint) == bool(args.model):
        raise ConfigError(["rlplane eval: give exactly one of --checkpoint DIR or --model NAME"])
    overrides = []
    preset = args.config
    if args.checkpoint:
        weights, ckpt = checkpoint_weights(args.checkpoint)
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
        # Evaluation sizes the sequence cap from its longest prompt + max_new_tokens: room for any value.
        overrides += [f"policy.generation.max_new_tokens={args.max_new_tokens}",
                      f"policy.max_total_sequence_length={args.max_new_tokens + EVAL_PROMPT_ROOM}"]
    cfg = load_config(preset, [*overrides, *args.overrides, "warmup.enabled=false", "runtime=local"])
    if args.output:
        _check_output_file(Path(args.output))
    from rlplane.evaluation import evaluate  # torch and transformers: once the command is known to be right

    k = args.k if args.k is not None else cfg.loop.val_num_generations_per_prompt
    # stdout carries one JSON document: what loading and generating print (the precision chosen) goes to stderr
    # once the evaluation has run, and not at all before a one-line error.
    printed = io.StringIO()
    with redirect_stdout(printed):
        result = evaluate(cfg, num_problems=args.num_problems, k=k, batch_size=args.batch_size,
                          progress=not args.quiet)
    sys.stderr.write(printed.getvalue())
    if args.checkpoint:
        result["checkpoint"] = str(args.checkpoint)
    text = json.dumps(result, indent=2)
    print(text)
    line = f"accuracy (greedy): {result['accuracy']:.4f} on {result['num_problems']} problems"
    if k > 1:
        line += f"; pass@{k} (sampled, T={cfg.policy.generation.temperature:g}): {result[f'pass@{k}']:.4f}"
    if "constant_answer" in result:
        const = result["constant_answer"]
        line += f"; always answering {const['answer']!r}: {const['accuracy']:.4f}"
    if args.output:
        try:
            Path(args.output).write_text(text + "\n")
        except OSError as e:  # checked writable before the evaluation; a disk can still fill meanwhile
            raise ConfigError([f"--output {args.output}: cannot write it ({e.strerror}); the result is on stdout "
                               "above"]) from None
    print(f"{line}  ({result['wall_seconds']} s)", file=sys.stderr)
    return 0


EVAL_PROMPT_ROOM = 1 << 20  # tokens; evaluation replaces the cap by longest prompt + max_new_tokens anyway


def _check_output_file(out) -> None:
    """``-o FILE`` must be writable, checked before the evaluation (a directory is refused)."""
    import tempfile

    from rlplane.errors import ConfigError

    if out.is_dir():
        raise ConfigError([f"--output {out}: is a directory; name a file, e.g. {out / 'eval.json'}"])
    parent = out.parent
    if parent.exists() and not parent.is_dir():
        raise ConfigError([f"--output {out}: {parent} is a file, not a directory; name a file in a directory"])
    try:
        parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".rlplane-probe-", dir=parent)
        try:
            os.write(fd, b"\0" * 4096)  # a full disk still creates an empty file
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        raise ConfigError([f"--output {out}: cannot write in {parent} ({e.strerror or type(e).__name__}); "
                           "name a file in a writable directory"]) from None


def cmd_export(args) -> int:
    """Copy a checkpoint's policy weights + tokenizer out as a plain HF model directory."""
    import shutil
    from pathlib import Path

    from rlplane.errors import ConfigError

    weights, ckpt = checkpoint_weights(args.checkpoint)
    out = Path(args.output).expanduser().absolute()
    if out.exists() and not out.is_dir():
        raise ConfigError([f"--output {out}: is a file; export writes a model directory: name a new directory"])
    if out.is_dir() and any(out.iterdir()):
        raise ConfigError([f"--output {out}: exists and is not empty; pick a new directory"])
    if out == weights.absolute() or weights.absolute() in out.parents:
        raise ConfigError([f"--output {out}: is inside the checkpoint it exports; pick a directory elsewhere"])
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        if (weights / "adapter_config.json").is_file():  # a LoRA checkpoint: merge it into its base model
            from rlplane.config.loading import load_config
            from rlplane.models.export import export_merged

            run_cfg = load_config(str(ckpt / "config.yaml"), [])
            export_merged(str(ckpt), str(tmp), run_cfg.policy, run_cfg.loop.seed)
        else:
            shutil.copytree(weights, tmp)
        if out.exists():
            out.rmdir()
        tmp.rename(out)  # never a half-copied model under the final name
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ConfigError([f"--output {out}: cannot write it ({e.strerror or type(e).__name__}); name a new "
                           "directory in a writable place"]) from None
    where = f"{ckpt.name} of {ckpt.parent.parent}" if ckpt is not None else str(weights)
    print(f"exported {where} to {out} (loads with AutoModelForCausalLM.from_pretrained)")
    return 0


def cmd_sweep(args) -> int:
    """The config over seeds (and variants, and its control), one run after another; a distribution, not a run."""
    from rlplane.sweeps.command import sweep

    return sweep(args)


def cmd_plot(args) -> int:
    from pathlib import Path

    from rlplane.utils.plot import plot_runs

    first = Path(args.run_dirs[0])
    output = args.output or ((first if first.is_dir() else first.parent) / "plot.png" if len(args.run_dirs) == 1
                             else "plot.png")
    png, page = plot_runs(args.run_dirs, output, say=lambda m: print(m, file=sys.stderr))
    print(f"wrote {png} and {page}")
    return 0


OVERWRITE_HELP = ("replace the earlier run in run_dir (its config, summary, checkpoints and metrics are deleted); "
                  "without it rlplane refuses a run_dir that holds one")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rlplane", description="RL post-training of language models (GRPO, PPO).")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="warm-up + GRPO or PPO (the embedded arithmetic GRPO job by default)")
    _add_config_args(p)
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    p.add_argument("--early-stop", action="store_true",
                   help="stop when validation accuracy has not improved in early_stop.patience (3) validations or "
                        "drops by more than early_stop.max_drop; early_stop.metric / min_delta tune it")
    p.set_defaults(fn=cmd_train)
    p = sub.add_parser("sft", help="only the supervised warm-up; saves an HF model to RUN_DIR/sft")
    _add_config_args(p)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    p.set_defaults(fn=cmd_sft)
    p = sub.add_parser("eval", help="held-out accuracy (greedy) and pass@k (sampled) of a checkpoint or model")
    p.add_argument("--checkpoint", default=None, help="a run directory (latest checkpoint), a "
                                                      "step_N checkpoint or an HF model directory")
    p.add_argument("--model", default=None, help="a policy.model_name instead: packaged:smollm2-135m-instruct, "
                                                 "packaged:gemma3-270m, embedded:tiny-llama, a directory")
    p.add_argument("--dataset", default=None,
                   help="arithmetic | reasoning_gym:TASK[,TASK] | FILE (.jsonl, "
                        ".json, .parquet, .csv); default: the config's data")
    p.add_argument("--num-problems", "-n", type=_at_least(1), default=None, help="held-out problems "
                                                                                 "(default: max_val_samples)")
    p.add_argument("-k", type=_at_least(1), default=None, help="sampled responses per problem for pass@k (default: "
                                                               "val_num_generations_per_prompt)")
    p.add_argument("--seed", type=_at_least(0), default=None, help="seed of the reasoning-gym held-out problems")
    p.add_argument("--max-new-tokens", type=_at_least(1), default=None, help="response length cap")
    p.add_argument("--batch-size", type=_at_least(1), default=16, help="problems per generation call")
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
    p = sub.add_parser("sweep", help="a config over several seeds (and numeric variants, and its control), one run "
                                     "after another: gain per run, mean ± sd, worst, best; a table and a figure")
    _add_config_args(p)
    p.add_argument("--seeds", type=_at_least(1), default=None, help="how many seeds: N runs seeds 1 to N (default 5)")
    p.add_argument("--seed-list", default=None, metavar="SEEDS",
                   help="which seeds instead: 42, 11-15 (a range) or 1,4,9 (a list)")
    p.add_argument("--control", nargs="?", const="permute", default=None, metavar="{permute,coin}",
                   help="also run the control: rewards permuted within each batch (default) or a coin with the "
                        "batch's mean; distillation: a teacher that learned nothing")
    p.add_argument("--control-seeds", type=_at_least(1), default=1, help="controls on the first N seeds (default 1)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME|KEY=VALUE",
                   help="also run every seed under a numeric variant standing in for another machine: threads1, "
                        "threads2, nofast (RLPLANE_FAST=0), fp32, bf16, or one KEY=VALUE override; may repeat")
    p.add_argument("--out", "-o", default=None,
                   help="the sweep's directory (default runs/sweep-<config>); each run is an ordinary run directory "
                        "in it; the same command continues it")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(fn=cmd_sweep)
    p = sub.add_parser("show-config", help="print the resolved config")
    _add_config_args(p)
    p.add_argument("--list", action="store_true", help="list the presets")
    p.set_defaults(fn=cmd_show_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # Overrides may follow flags; argparse's positional list stops at the first flag.
    overrides = [a for a in extra if "=" in a and not a.startswith("-")]
    unknown = [a for a in extra if a not in overrides]
    if unknown or (overrides and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(unknown or overrides)}")
    if overrides:
        args.overrides = [*args.overrides, *overrides]
    from rlplane.errors import TrainingInterrupted

    try:
        from rlplane.fast.switches import check_switches

        check_switches()
        return args.fn(args)
    except TrainingInterrupted as e:
        print(f"rlplane: {e}", file=sys.stderr)
        return 128 + e.signum
    except BrokenPipeError:  # `rlplane show-config | head`: the reader left; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's final flush too
        return 141
    except _user_errors() as e:
        # A Ray worker's error arrives wrapped (RayTaskError, also an instance of the cause's class).
        cause = getattr(e, "cause", None)
        for line in str(cause if isinstance(cause, _user_errors()) else e).splitlines():
            print(f"rlplane: error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rlplane: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM) and e.filename:  # a path this user may not use, wherever it came up
            print(f"rlplane: error: {e.filename}: {e.strerror} (uid {os.getuid()}); give a path this user may use, "
                  "or change its permissions", file=sys.stderr)
            return 2
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = f" writing {e.filename}" if e.filename else ""
        print(f"rlplane: error: the disk is full{where} ({e.strerror}); free space (the last checkpoint is whole: "
              "resume with checkpointing.resume=true)", file=sys.stderr)
        return 2
    except SystemExit as e:  # no command exits by itself: user code (a reward function, an environment) did
        from rlplane.envs.user import user_exit_message

        print(f"rlplane: error: {user_exit_message(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
