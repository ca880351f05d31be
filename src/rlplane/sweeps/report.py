"""A sweep's runs read back from their run directories and summarised: per-run gain in held-out accuracy, and
per group (as configured, each variant, the control) n, mean ± sd, worst, best and time per run; written as
markdown, JSON and one figure with every run's validation curve."""

from __future__ import annotations

import json
import statistics
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rlplane.sweeps.plan import SweepRun

GAIN_UNIT = 100.0  # gains in points of accuracy (0.332 -> 0.564: +23.2)


@dataclass
class RunResult:
    label: str
    seed: int
    variant: str
    control: str | None
    status: str  # "done", "failed", "not run"
    start: float | None = None
    end: float | None = None
    best: float | None = None
    wall_s: float | None = None
    error: str | None = None
    curve: list[tuple[int, float]] = field(default_factory=list)

    @property
    def gain(self) -> float | None:
        if self.start is None or self.end is None:
            return None
        return (self.end - self.start) * GAIN_UNIT

    @property
    def group(self) -> str:
        if self.control is not None:
            return f"control ({self.control})"
        return self.variant or "as configured"


def _validation_curve(run_dir: Path) -> list[tuple[int, float]]:
    path = run_dir / "logs" / "metrics.jsonl"
    curve = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a cut last line
            if isinstance(row, dict) and isinstance(row.get("validation/accuracy"), (int, float)):
                curve.append((int(row["step"]), float(row["validation/accuracy"])))
    return curve


def read_run(out: Path, run: SweepRun) -> RunResult:
    """The run's result from ``out/<label>`` (summary, metrics) and ``out/logs/<label>.json`` (exit code, wall time)."""
    d = out / run.label
    res = RunResult(run.label, run.seed, run.variant, run.control, "not run")
    record = out / "logs" / f"{run.label}.json"
    rec = json.loads(record.read_text()) if record.is_file() else {}
    summary = d / "summary.json"
    if summary.is_file():
        s = json.loads(summary.read_text())
        res.status = "done"
        res.start, res.end = s.get("accuracy_before"), s.get("accuracy_after")
        res.wall_s = rec.get("wall_s", s.get("wall_seconds"))
        res.curve = _validation_curve(d)
        res.best = max((v for _, v in res.curve), default=None)
    elif rec.get("rc") not in (None, 0):
        res.status, res.error, res.wall_s = "failed", rec.get("error"), rec.get("wall_s")
    return res


@dataclass
class GroupStats:
    group: str
    n: int
    mean: float
    sd: float | None
    worst: float
    best: float
    mean_wall_s: float | None


def group_stats(results: list[RunResult]) -> list[GroupStats]:
    """Per group, in order of first appearance: the gains of its finished runs (sd over n - 1; none for one run)."""
    out = []
    for name in dict.fromkeys(r.group for r in results):
        done = [r for r in results if r.group == name and r.gain is not None]
        if not done:
            continue
        gains = [r.gain for r in done]
        walls = [r.wall_s for r in done if r.wall_s is not None]
        out.append(GroupStats(name, len(gains), statistics.fmean(gains),
                              statistics.stdev(gains) if len(gains) > 1 else None, min(gains), max(gains),
                              statistics.fmean(walls) if walls else None))
    return out


def _points(v: float | None) -> str:
    return "n/a" if v is None else f"{v:+.1f}"


def acc_text(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _secs(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f} s"


def markdown(title: str, header: list[str], results: list[RunResult], stats: list[GroupStats]) -> str:
    lines = [f"# {title}", "", *[f"- {h}" for h in header], "",
             "| run | seed | start | end | gain (points) | best | wall |", "|---|---|---|---|---|---|---|"]
    for r in results:
        if r.status == "done":
            lines.append(f"| {r.label} | {r.seed} | {acc_text(r.start)} | {acc_text(r.end)} | {_points(r.gain)} | "
                         f"{acc_text(r.best)} | {_secs(r.wall_s)} |")
        else:
            lines.append(f"| {r.label} | {r.seed} | {r.status}{': ' + r.error if r.error else ''} | | | | |")
    lines += ["", "| runs | n | gain mean ± sd | worst | best | time per run |", "|---|---|---|---|---|---|"]
    for g in stats:
        sd = f" ± {g.sd:.1f}" if g.sd is not None else ""
        lines.append(f"| {g.group} | {g.n} | {g.mean:+.1f}{sd} | {g.worst:+.1f} | {g.best:+.1f} | "
                     f"{_secs(g.mean_wall_s)} |")
    return "\n".join(lines) + "\n"


def console_lines(stats: list[GroupStats]) -> list[str]:
    out = []
    for g in stats:
        sd = f" ± {g.sd:.1f} (sd)" if g.sd is not None else ""
        out.append(f"{g.group}: {g.n} run{'s' if g.n > 1 else ''}, gain {g.mean:+.1f}{sd}, worst {g.worst:+.1f}, "
                   f"best {g.best:+.1f} points; {_secs(g.mean_wall_s)} per run")
    return out


def to_json(meta: dict, results: list[RunResult], stats: list[GroupStats]) -> str:
    runs = [{**asdict(r), "gain": r.gain, "group": r.group} for r in results]
    return json.dumps({**meta, "runs": runs, "groups": [asdict(g) for g in stats]}, indent=1) + "\n"


def plot(path: Path, title: str, results: list[RunResult]) -> bool:
    """Every finished run's validation accuracy by step on one figure (configured runs solid, variants dashed,
    controls grey and dotted). False when matplotlib is missing (``rlplane[plot]``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(9, 5.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    seeds = list(dict.fromkeys(r.seed for r in results))
    for r in results:
        if not r.curve:
            continue
        steps, acc = zip(*r.curve)
        if r.control is not None:
            style = dict(color="0.5", linestyle=":", linewidth=1.5)
        else:
            style = dict(color=colors[seeds.index(r.seed) % len(colors)], linestyle="--" if r.variant else "-",
                         linewidth=1.2 if r.variant else 1.8)
        ax.plot(steps, acc, label=f"{r.label} ({_points(r.gain)})", **style)
    ax.set_xlabel("step")
    ax.set_ylabel("held-out accuracy")
    ax.set_title("\n".join(textwrap.wrap(title, 110)), fontsize=8)
    ax.grid(alpha=0.3)
    if ax.lines:  # none when no run validated
        ax.legend(fontsize=7, ncol=2 if len(results) > 8 else 1)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True

