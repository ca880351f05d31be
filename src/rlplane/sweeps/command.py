"""``rlplane sweep``: its options and every run's config checked before the first run starts, then the runs.

A mistake is one line before anything is written: in the options (seeds, variants, the control), in what the
sweep sets itself (``run_dir``, the seed, where a run keeps its checkpoints and logs), or in the config a variant
or the control makes (a key the config does not have, a seed past 64 bits). A run that starts has a config that
loads.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from rlplane.config.loading import load_config
from rlplane.config.recipes import RECIPES
from rlplane.errors import ConfigError
from rlplane.sweeps.plan import MAX_SEEDS, SweepRun, parse_seeds, parse_variant, plan_runs
from rlplane.sweeps.runner import claim_directory, hold_directory, identity, run_sweep
from rlplane.utils.machine import describe_machine

# Where a run keeps its checkpoints and logs: the sweep keeps both in the run's own directory (NeMo RL's files
# name shared ones, `results/grpo`, `logs`), so its runs neither collide nor hide their curves from the report.
RUN_PATHS = ("checkpointing.checkpoint_dir", "logger.log_dir")


def _key(override: str) -> str:
    """An override's dotted key as the config reads it (``+key=``, ``~key``, spaces around it)."""
    return override.split("=", 1)[0].strip().lstrip("+~").strip()


def _seeds(args) -> list[int]:
    if args.seeds is not None and args.seed_list is not None:
        raise ConfigError([f"--seeds {args.seeds} and --seed-list {args.seed_list}: give one (a count, or which "
                           "seeds)"])
    if args.seed_list is not None:
        return parse_seeds(args.seed_list)
    count = 5 if args.seeds is None else args.seeds
    if count > MAX_SEEDS:  # said before a list of them is built
        raise ConfigError([f"--seeds {count}: more than {MAX_SEEDS} seeds; sweep fewer at a time"])
    return list(range(1, count + 1))


def _check_what_the_sweep_sets(args, variants, loop: str) -> None:
    owned = ("run_dir", f"{loop}.seed", *RUN_PATHS)
    why = (f"a sweep sets run_dir (--out DIR/<run>) and {loop}.seed (--seeds) for each run, and keeps its checkpoints "
           "and logs in its run directory")
    for o in args.overrides:
        if _key(o) in owned:
            raise ConfigError([f"{o}: {why}; drop the override"])
    for v in variants:
        for o in v.overrides:
            if _key(o) in owned:
                raise ConfigError([f"--variant {o!r}: {why}; vary another key"])


def _check_control(cfg, loop: str, control: str | None) -> None:
    if control is None:
        return
    if getattr(getattr(cfg, loop), "reward_control", None) is not None:
        raise ConfigError([f"--control: {loop}.reward_control = {getattr(cfg, loop).reward_control} makes every run "
                           "of the sweep a control already; set it to null, or leave out --control"])
    if cfg.algorithm == "distillation":
        teacher = cfg.teacher
        if not teacher.model_name.startswith("embedded:"):
            raise ConfigError([f"--control: teacher.model_name = {teacher.model_name} is pretrained; without a warm-up "
                               "it still knows what it knows, so it is no control; sweep without --control"])
        if not teacher.warmup.enabled:
            raise ConfigError(["--control: teacher.warmup.enabled = false already: the teacher learns nothing in "
                               "every run, so the control would be the runs themselves; leave out --control"])


def _check_every_run(args, base: list[str], runs: list[SweepRun]) -> None:
    """Each group's config (as configured, each variant, the control) at its largest seed loads: one line naming the
    option that broke it, before the first run."""
    largest: dict[tuple[str, str | None], SweepRun] = {}
    for r in runs:
        if (r.variant, r.control) not in largest or r.seed > largest[(r.variant, r.control)].seed:
            largest[(r.variant, r.control)] = r
    for (variant, control), run in largest.items():
        try:
            load_config(args.config, [*base, *run.overrides], notes=[])
        except ConfigError as e:
            what = "--control" if control else f"--variant {variant}" if variant else f"seed {run.seed}"
            raise ConfigError([f"{what}: {p}" for p in e.problems]) from None


def sweep(args) -> int:
    if args.control is not None and "=" in args.control:  # `--control KEY=VALUE`: the override taken as its kind
        args.overrides = [args.control, *args.overrides]
        args.control = "permute"
    seeds = _seeds(args)
    variants = [parse_variant(v) for v in args.variant]
    cfg = load_config(args.config, args.overrides)
    loop = RECIPES[cfg.algorithm].loop
    _check_what_the_sweep_sets(args, variants, loop)
    _check_control(cfg, loop, args.control)
    runs = plan_runs(algorithm=cfg.algorithm, loop=loop, seeds=seeds, variants=variants, control=args.control,
                     control_seeds=args.control_seeds)
    # The config's own checkpoint and log directories (a NeMo RL file's): each run's in its run directory instead.
    base = [*args.overrides, *(f"{k}=null" for k in RUN_PATHS if _value(cfg, k) is not None)]
    _check_every_run(args, base, runs)
    name = args.config or "grpo_arithmetic"
    out = Path(args.out or f"runs/sweep-{Path(name).stem}").expanduser().absolute()
    claim_directory(out, identity(args.config, args.overrides, cfg.model_dump(mode="json"), loop))
    lock = hold_directory(out)
    title = f"rlplane sweep: {name}" + (f" {' '.join(args.overrides)}" if args.overrides else "")
    header = [f"machine: {describe_machine()}", f"date: {datetime.date.today().isoformat()}",
              f"seeds: {' '.join(map(str, seeds))}"
              + (f"; variants: {', '.join(f'{v.name} ({v.what})' for v in variants)}" if variants else "")
              + (f"; control: {runs[-1].control} on {args.control_seeds} seed(s)" if args.control else ""),
              "gain: held-out accuracy at the end minus before the first step, in points"]
    say = (lambda m: None) if args.quiet else (lambda m: print(m, flush=True))
    say(title)
    for line in header:
        say(line)
    if base != args.overrides:
        say(f"each run keeps its checkpoints and logs in its run directory ({', '.join(base[len(args.overrides):])})")
    try:
        results = run_sweep(args.config, base, runs, out, header=header, title=title, say=say)
    finally:
        lock.release()
    return 0 if all(r.status == "done" for r in results) else 1


def _value(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node
