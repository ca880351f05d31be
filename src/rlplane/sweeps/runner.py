"""Run a sweep: its runs one after another (a small machine runs one at a time), each ``rlplane train`` in a
process of its own with its own log, into ``<out>/<label>``; runs already finished are kept, so an interrupted
sweep continues where it stopped when the same command is given again.

``<out>/sweep.json`` records what the sweep is (the config, the overrides and the resolved config without seed and
run_dir): a later command into the same directory must be the same sweep (more seeds, variants or controls may be
added), never another one.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rlplane.errors import ConfigError
from rlplane.sweeps.plan import SweepRun
from rlplane.sweeps.report import RunResult, console_lines, group_stats, markdown, plot, read_run, to_json
from rlplane.utils.run_dir import LOCK_FILE, RunLock

PLAN_FILE = "sweep.json"
REPORT_FILES = ("sweep.md", "results.json", "curves.png")
_RUN_FILES = ("config.yaml", "summary.json")  # an ordinary run directory holds these (utils/run_dir.py)


def identity(config: str | None, overrides: list[str], resolved: dict, loop: str) -> dict:
    """What a sweep is: its config, overrides and resolved config with the keys the sweep sets per run removed."""
    tree = json.loads(json.dumps(resolved))
    tree.pop("run_dir", None)
    tree.pop("expected", None)  # the figures a preset prints, not what its runs compute
    if isinstance(tree.get(loop), dict):
        tree[loop].pop("seed", None)
    return {"config": config, "overrides": list(overrides), "resolved": tree}


def _differences(a, b, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ; a key only one side has (a setting added to rlplane since the sweep began,
    at its default) is not a difference."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in [*a, *(k for k in b if k not in a)]:
            if k in a and k in b:
                out += _differences(a[k], b[k], f"{prefix}.{k}" if prefix else str(k))
        return out
    return [] if a == b else [prefix]


def claim_directory(out: Path, ident: dict) -> None:
    """Make ``out`` this sweep's directory, or check that it already is: one line if it holds a run or another
    sweep."""
    if out.exists() and not out.is_dir():
        raise ConfigError([f"--out {out}: is a file; name a directory for the sweep"])
    if any((out / f).is_file() for f in _RUN_FILES):
        raise ConfigError([f"--out {out}: holds a training run (config.yaml/summary.json), not a sweep; name a new "
                           "directory"])
    plan = out / PLAN_FILE
    if plan.is_file():
        try:
            saved = json.loads(plan.read_text())
        except ValueError:
            raise ConfigError([f"--out {out}: {PLAN_FILE} is damaged; name a new directory or delete it"]) from None
        keys = _differences(saved.get("resolved"), ident["resolved"])
        if keys or not isinstance(saved.get("resolved"), dict):
            shown = ", ".join(keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")
            raise ConfigError([f"--out {out}: holds a sweep of another config (it differs at {shown}); continue it "
                               f"with its own config and overrides ({PLAN_FILE}) or name a new directory"])
        return
    if out.is_dir() and any(p.name not in ("logs", LOCK_FILE) for p in out.iterdir()):
        raise ConfigError([f"--out {out}: is not empty and holds no sweep; name a new or empty directory"])
    try:
        (out / "logs").mkdir(parents=True, exist_ok=True)
        plan.write_text(json.dumps(ident, indent=1) + "\n")
    except OSError as e:
        raise ConfigError([f"--out {out}: cannot write there ({e.strerror or type(e).__name__}); name a directory "
                           "you can write"]) from None


def hold_directory(out: Path) -> RunLock:
    """The sweep's lock on ``out`` for its life (one sweep writes a directory at a time); one line if another
    sweep holds it."""
    try:
        return RunLock(out).acquire()
    except ConfigError as e:
        line = e.problems[0].replace(f"run_dir = {str(out)!r}", f"--out {out}")
        line = line.replace("another rlplane run", "another rlplane sweep").replace("pick another run_dir",
                                                                                  "name another --out")
        raise ConfigError([line]) from None


def train_command(config: str | None, overrides: list[str], run: SweepRun, run_dir: Path, overwrite: bool) -> list[str]:
    cmd = [sys.executable, "-m", "rlplane.cli", "train"]
    if config is not None:
        cmd += ["--config", config]
    cmd += [*overrides, *run.overrides, f"run_dir={run_dir}"]
    return cmd + (["--overwrite"] if overwrite else [])


def _last_error(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.is_file() else []
    errors = [line for line in lines if line.startswith("rlplane: error:")]
    return (errors or lines or ["no output"])[-1][:300]


def run_one(config: str | None, overrides: list[str], run: SweepRun, out: Path) -> tuple[int, float]:
    """``rlplane train`` for ``run`` into ``out/<label>``, its output in ``out/logs/<label>.log``; returns (exit code,
    seconds). Ctrl-C reaches the run too (same process group): it stops after its step; the sweep then stops."""
    run_dir = out / run.label
    cmd = train_command(config, overrides, run, run_dir, overwrite=run_dir.exists())
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"), **dict(run.env)}
    log = out / "logs" / f"{run.label}.log"
    t0 = time.perf_counter()
    with open(log, "w") as f:
        f.write(f"$ {' '.join(f'{k}={v}' for k, v in run.env)} {shlex.join(cmd)}\n".lstrip())
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        try:
            rc = proc.wait()
        except KeyboardInterrupt:  # the run got the signal too: let it stop at its step boundary
            try:
                proc.wait(timeout=600)
            except (KeyboardInterrupt, subprocess.TimeoutExpired):
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            raise
    wall = time.perf_counter() - t0
    record = {"rc": rc, "wall_s": wall, "error": _last_error(log) if rc else None,
              "finished": datetime.datetime.now().isoformat(timespec="seconds")}
    (out / "logs" / f"{run.label}.json").write_text(json.dumps(record) + "\n")
    return rc, wall


def run_sweep(config: str | None, overrides: list[str], runs: list[SweepRun], out: Path, *, header: list[str],
              title: str, say: Callable[[str], None]) -> list[RunResult]:
    """Run what is not finished yet, then write the report; returns every run's result."""
    n = len(runs)
    for i, run in enumerate(runs, start=1):
        done = read_run(out, run)
        if done.status == "done":
            say(f"[{i}/{n}] {run.label}: finished earlier, gain {_gain(done)}")
            continue
        say(f"[{i}/{n}] {run.label}: running (log: {out / 'logs' / (run.label + '.log')})")
        rc, wall = run_one(config, overrides, run, out)
        res = read_run(out, run)
        if rc == 0 and res.status == "done":
            say(f"[{i}/{n}] {run.label}: {res.start:.3f} -> {res.end:.3f}, gain {_gain(res)} in {wall:.0f} s")
        else:
            why = res.error or _last_error(out / "logs" / f"{run.label}.log")
            say(f"[{i}/{n}] {run.label}: failed (exit {rc}): {why}")
    results = [read_run(out, r) for r in runs]
    stats = group_stats(results)
    (out / "sweep.md").write_text(markdown(title, header, results, stats))
    meta = {"title": title, "header": header}
    (out / "results.json").write_text(to_json(meta, results, stats))
    drew = plot(out / "curves.png", title + "\n" + header[0], results)
    for line in console_lines(stats):
        say(line)
    say(f"wrote {out / 'sweep.md'}, {out / 'results.json'}"
        + (f" and {out / 'curves.png'}" if drew else " (no figure: pip install 'rlplane[plot]')"))
    return results


def _gain(r: RunResult) -> str:
    return "n/a" if r.gain is None else f"{r.gain:+.1f} points"
