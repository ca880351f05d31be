"""``rlplane plot RUN_DIR ...``: reward, accuracy, KL/entropy/mismatch, clip fractions, response length, reward
spread within groups and phase times of runs, overlaid.

Writes a PNG and an HTML page; matplotlib (``rlplane[plot]``) is imported lazily, Agg backend.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from pathlib import Path

from rlplane.errors import ConfigError

# (title, [(metric key, label)]); a panel with several keys draws each, per run.
PANELS: list[tuple[str, list[tuple[str, str]]]] = [
    ("train reward (mean, before shaping)", [("train/reward", "reward")]),
    ("validation accuracy (greedy) and answer spread",
     [("validation/accuracy", "accuracy"), ("validation/constant_answer_accuracy", "one constant answer's accuracy"),
      ("validation/top_answer_share", "share of the commonest answer")]),
    ("KL and entropy", [("train/kl_penalty", "KL to reference"), ("train/gen_kl_error", "KL gen vs train"),
                        ("train/approx_entropy", "entropy")]),
    ("token_mult_prob_error (1 = generator and trainer agree)", [("train/token_mult_prob_error", "prob error")]),
    ("clip fraction", [("train/clip_fraction", "clipped"), ("train/clip_fraction_low", "low"),
                       ("train/clip_fraction_high", "high")]),
    ("response length (tokens)", [("train/mean_gen_tokens_per_sample", "mean"),
                                  ("train/max_gen_tokens_per_sample", "max")]),
    ("reward spread within groups", [("train/reward_std_in_group", "reward std (mean over groups)"),
                                     ("train/equal_reward_groups", "all-equal groups (fraction)")]),
    ("total step time (s)", [("timing/train/total_step_time", "step time")]),
]
GRID = (3, 3)  # rows, columns of the PNG: every panel and the step time per phase
TIMING_PREFIX = "timing/train/"


def load_run(path: str | Path, say=None) -> tuple[str, list[dict]]:
    """(run name, metric rows) of a run directory, its ``logs`` or a ``metrics.jsonl``; a cut last line is skipped."""
    p = Path(path)
    if not p.exists():
        raise ConfigError([f"rlplane plot {path}: no such file or directory; pass a run directory"])
    for candidate in (p / "logs" / "metrics.jsonl", p / "metrics.jsonl", p):
        if candidate.is_file():
            name = p.name if p.is_dir() else p.parent.name
            return (name if name != "logs" else p.parent.name), _read_metrics(candidate, say)
    raise ConfigError([f"rlplane plot {path}: no metrics.jsonl there (looked in {p / 'logs'}); pass a run directory"])


def _read_metrics(path: Path, say) -> list[dict]:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError([f"rlplane plot {path}: cannot read it ({e.strerror or type(e).__name__})"]) from None
    lines = data.split(b"\n")
    rows, skipped = [], None
    for i, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        last = all(not r.strip() for r in lines[i:])
        try:
            row = json.loads(raw.decode("utf-8"))
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                raise ValueError("not a metrics row")
        except UnicodeDecodeError as e:
            raise ConfigError([f"rlplane plot {path}, line {i}: not UTF-8 text (byte 0x{raw[e.start]:02x}); "
                               "is it a metrics.jsonl that rlplane wrote?"]) from None
        except ValueError:
            if last and rows:  # cut short by a run still writing or killed mid-line
                skipped = f"rlplane plot: {path}, line {i}: incomplete last line, skipped"
                continue
            raise ConfigError([f"rlplane plot {path}, line {i}: not a metrics row (JSON object with a step); "
                               "is it a metrics.jsonl that rlplane wrote?"]) from None
        rows.append(row)
    if not rows:
        raise ConfigError([f"rlplane plot {path}: no metrics rows in it; pass a run directory"])
    if skipped and say is not None:
        say(skipped)
    return rows


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return [s for s, _ in pts], [v for _, v in pts]


def _timing_keys(runs: list[tuple[str, list[dict]]]) -> list[str]:
    keys = {k for _, rows in runs for r in rows for k in r if k.startswith(TIMING_PREFIX)}
    return sorted(k for k in keys if not k.endswith("total_step_time"))


def figures(runs: list[tuple[str, list[dict]]]):
    """The :data:`GRID` of panels (the PNG) and one figure per panel (the HTML): ``(grid, [(title, figure), ...])``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [*PANELS, ("step time per phase (s)", [(k, k[len(TIMING_PREFIX):]) for k in _timing_keys(runs)])]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["-", "--", ":", "-."]

    def draw(ax, title, keys):
        drawn = 0
        for r, (name, rows) in enumerate(runs):
            for k, (key, label) in enumerate(keys):
                steps, values = _series(rows, key)
                if not steps:
                    continue
                # A run keeps its colour across panels; in multi-key panels the metric picks the style.
                style = dict(color=colors[r % len(colors)], linestyle=styles[k % len(styles)])
                many = len(keys) > 1
                tag = f"{name}: {label}" if len(runs) > 1 and many else (label if many else name)
                ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=tag, **style)
                drawn += 1
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
        return drawn

    grid, axes = plt.subplots(*GRID, figsize=(6 * GRID[1], 4 * GRID[0]))
    for ax, (title, keys) in zip(axes.flat, panels):
        draw(ax, title, keys)
    names = ", ".join(name for name, _ in runs)
    grid.suptitle(f"rlplane: {names}", fontsize=12)
    grid.tight_layout()
    singles = []
    for title, keys in panels:
        fig, ax = plt.subplots(figsize=(7, 4))
        draw(ax, title, keys)
        fig.tight_layout()
        singles.append((title, fig))
    return grid, singles


def plot_runs(run_dirs: list[str], output: str | Path, say=None) -> tuple[Path, Path]:
    """Write ``output`` (PNG) and the same path with ``.html``; ``say`` hears of skipped lines. Returns both."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError(["rlplane plot: matplotlib is not installed; pip install 'rlplane[plot]'"]) from None
    import matplotlib.pyplot as plt

    png = Path(output)
    from matplotlib.backend_bases import FigureCanvasBase

    kinds = FigureCanvasBase.get_supported_filetypes()
    if png.suffix and png.suffix[1:].lower() not in kinds:
        raise ConfigError([f"--output {output}: matplotlib cannot write {png.suffix!r} files; name a .png file "
                           f"(or {', '.join('.' + k for k in sorted(kinds) if k != 'png')})"])
    if png.is_dir():
        raise ConfigError([f"--output {output}: is a directory; name a file, e.g. {png / 'plot.png'}"])
    runs = [load_run(d, say) for d in run_dirs]
    try:
        png.parent.mkdir(parents=True, exist_ok=True)
        with open(png, "ab"):  # writable? checked before any drawing
            pass
    except OSError as e:
        raise ConfigError([f"--output {output}: cannot write it ({e.strerror or type(e).__name__}); "
                           "name a .png file in a writable directory"]) from None
    grid, singles = figures(runs)
    try:
        grid.savefig(png, dpi=100)
    except OSError as e:
        raise ConfigError([f"--output {output}: cannot write it ({e.strerror or type(e).__name__})"]) from None
    parts = []
    for title, fig in singles:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        img = base64.b64encode(buf.getvalue()).decode()
        parts.append(f"<h2>{html.escape(title)}</h2>\n<img src=\"data:image/png;base64,{img}\">")
    for fig in [grid, *(f for _, f in singles)]:
        plt.close(fig)
    names = ", ".join(html.escape(f"{name} ({len(rows)} rows)") for name, rows in runs)
    page = png.with_suffix(".html")
    try:
        page.write_text(f"<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>rlplane plot</title></head>\n"
                        f"<body style=\"font-family: sans-serif\">\n<h1>rlplane: {names}</h1>\n" + "\n".join(parts)
                        + "\n</body></html>\n")
    except OSError as e:
        raise ConfigError([f"--output {output}: cannot write {page} ({e.strerror or type(e).__name__})"]) from None
    return png, page
