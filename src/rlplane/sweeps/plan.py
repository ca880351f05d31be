"""What a sweep runs: the runs (seed × variant, plus controls) and how each differs from the config. Plain data.

A run is the config plus its overrides and environment: ``<loop>.seed=S``, a variant's overrides or environment
variables, a control's overrides, and ``run_dir=<sweep dir>/<label>``. Labels name the run's directory:
``seed3``, ``seed3-threads1``, ``seed3-control``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rlplane.errors import ConfigError

CONTROL_KINDS = ("permute", "coin")
MAX_SEEDS = 1000


@dataclass(frozen=True)
class Variant:
    """A numeric variant that stands in for another machine: overrides and environment variables."""

    name: str
    overrides: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    what: str


# Each changes the floating-point path, not the recipe: one thread reduces in another order, the plain twins of
# rlplane.fast round differently, fp32 and bf16 are other arithmetic altogether.
VARIANTS = {
    "threads1": Variant("threads1", ("policy.threads_per_worker=1",), (("OMP_NUM_THREADS", "1"),),
                        "one torch thread per worker"),
    "threads2": Variant("threads2", ("policy.threads_per_worker=2",), (("OMP_NUM_THREADS", "2"),),
                        "two torch threads per worker (a model narrower than 256 runs one by default)"),
    "nofast": Variant("nofast", (), (("RLPLANE_FAST", "0"),), "every rlplane.fast path off (their plain twins)"),
    "fp32": Variant("fp32", ("policy.precision=fp32",), (), "fp32 forwards"),
    "bf16": Variant("bf16", ("policy.precision=bf16",), (), "bf16 autocast forwards"),
}


@dataclass(frozen=True)
class SweepRun:
    label: str
    seed: int
    variant: str  # "" for the config as given
    control: str | None  # the control's name, None for a real run
    overrides: tuple[str, ...]
    env: tuple[tuple[str, str], ...]


def parse_seeds(text: str) -> list[int]:
    """``42`` (one seed), ``11-15`` (a range, both ends in) or ``1,4,9`` (a list, ranges allowed in it); one line on
    anything else."""
    seeds: list[int] = []
    for part in text.split(","):
        p = part.strip()
        if m := re.fullmatch(r"(\d+)\s*-\s*(\d+)", p):
            lo, hi = int(m.group(1)), int(m.group(2))
            if hi < lo:
                raise ConfigError([f"--seed-list {text}: {p} ends before it starts; write LOW-HIGH, e.g. 11-15"])
            if hi - lo + 1 + len(seeds) > MAX_SEEDS:  # counted before it is listed
                raise ConfigError([f"--seed-list {text}: more than {MAX_SEEDS} seeds; sweep fewer at a time"])
            seeds += range(lo, hi + 1)
        elif re.fullmatch(r"\d+", p):
            seeds.append(int(p))
        else:
            raise ConfigError([f"--seed-list {text!r}: {p!r} is not a seed or a range; e.g. --seed-list 42, "
                               "--seed-list 11-15 or --seed-list 1,4,9"])
    if len(seeds) > MAX_SEEDS:
        raise ConfigError([f"--seed-list {text}: more than {MAX_SEEDS} seeds; sweep fewer at a time"])
    if dupes := sorted({s for s in seeds if seeds.count(s) > 1}):
        raise ConfigError([f"--seed-list {text}: seed {', '.join(map(str, dupes))} given twice; each seed runs once"])
    return seeds


def parse_variant(text: str) -> Variant:
    """A named variant (:data:`VARIANTS`), or ``KEY=VALUE`` overrides (several separated by spaces) as one."""
    if text in VARIANTS:
        return VARIANTS[text]
    overrides = text.split()
    if overrides and all(re.fullmatch(r"[A-Za-z_][\w.-]*\.[\w.-]+=\S*", o) for o in overrides):
        slug = re.sub(r"[^A-Za-z0-9_.=+-]+", "_", "+".join(overrides))[:100]
        return Variant(slug, tuple(overrides), (), ", ".join(o.replace("=", " = ", 1) for o in overrides))
    raise ConfigError([f"--variant {text!r}: not a named variant ({', '.join(VARIANTS)}) or KEY=VALUE overrides; "
                       "e.g. --variant threads1 or --variant 'policy.optimizer.lr=1e-3 grpo.max_num_steps=300'"])


def control_overrides(algorithm: str, loop: str, kind: str) -> list[str]:
    """What makes a run of ``algorithm`` its control: rewards that carry no information (``<loop>.reward_control``),
    or, for distillation (no reward in its loss), a teacher that learned nothing (no warm-up: its initial weights)."""
    if kind not in CONTROL_KINDS:
        raise ConfigError([f"--control {kind}: not a control; use {' or '.join(CONTROL_KINDS)}"])
    if algorithm == "distillation":
        if kind != "permute":
            raise ConfigError([f"--control {kind}: distillation has no reward to replace (its control is a teacher "
                               "that learned nothing); use --control without a kind"])
        return ["teacher.warmup.enabled=false"]
    return [f"{loop}.reward_control={kind}"]


def control_name(algorithm: str, kind: str) -> str:
    if algorithm == "distillation":
        return "untrained teacher"
    return "rewards permuted" if kind == "permute" else "rewards a coin"


def plan_runs(*, algorithm: str, loop: str, seeds: list[int], variants: list[Variant], control: str | None,
              control_seeds: int) -> list[SweepRun]:
    """Every seed as configured, then every seed under each variant, then the control on the first
    ``control_seeds`` seeds."""
    names = [v.name for v in variants]
    if dupes := sorted({n for n in names if names.count(n) > 1}):
        raise ConfigError([f"--variant {', '.join(dupes)} given twice; each variant runs once per seed"])
    if control is not None and not 1 <= control_seeds <= len(seeds):
        raise ConfigError([f"--control-seeds {control_seeds}: must be between 1 and the number of seeds "
                           f"({len(seeds)})"])
    runs = [SweepRun(f"seed{s}", s, "", None, (f"{loop}.seed={s}",), ()) for s in seeds]
    for v in variants:
        runs += [SweepRun(f"seed{s}-{v.name}", s, v.name, None, (f"{loop}.seed={s}", *v.overrides), v.env)
                 for s in seeds]
    if control is not None:
        extra = tuple(control_overrides(algorithm, loop, control))
        runs += [SweepRun(f"seed{s}-control", s, "", control_name(algorithm, control), (f"{loop}.seed={s}", *extra), ())
                 for s in seeds[:control_seeds]]
    return runs
