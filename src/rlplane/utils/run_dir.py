"""The run directory and the paths under it, checked before anything slow starts.

A run writes ``run_dir/config.yaml``, ``summary.json``, checkpoints (``checkpointing.checkpoint_dir``,
default ``run_dir/checkpoints``) and metrics (``logger.log_dir``, default ``run_dir/logs``). Before
a run starts, :func:`prepare_run_paths`:

- resolves the three to absolute paths on the driver (workers, maybe Ray actors on other nodes or
  in another working directory, are handed these, never a relative path);
- creates them and writes a probe file in each, so a path that cannot be written (``/proc/...``,
  an existing file, a read-only mount) is a one-line error now rather than a traceback at the
  first checkpoint;
- refuses a directory that holds an earlier run (its config, summary, checkpoints or metrics)
  unless the run resumes it (``checkpointing.resume=true``) or the user asked to replace it
  (``rlplane train --overwrite``, which removes those files and nothing else).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlplane.config.loading import ConfigError

RUN_FILES = ("config.yaml", "summary.json")
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
_CHECKPOINT_PREFIXES = ("step_", "tmp_step_", "old_step_")


@dataclass(frozen=True)
class RunPaths:
    run_dir: Path
    checkpoint_dir: Path
    log_dir: Path


def run_paths(cfg) -> RunPaths:
    """The run's three directories as absolute paths (nothing is created)."""
    run_dir = Path(cfg.run_dir).expanduser().absolute()
    ck, lg = cfg.checkpointing.checkpoint_dir, cfg.logger.log_dir
    return RunPaths(
        run_dir=run_dir,
        checkpoint_dir=Path(ck).expanduser().absolute() if ck else run_dir / "checkpoints",
        log_dir=Path(lg).expanduser().absolute() if lg else run_dir / "logs",
    )


def _reason(e: OSError) -> str:
    return e.strerror or type(e).__name__


def ensure_writable_dir(path: Path, key: str) -> None:
    """Create ``path`` (with parents) and write and remove a probe file in it; a :class:`ConfigError`
    naming the config ``key`` if either fails."""
    fix = f"set {key} to a directory you can write"
    if path.exists() and not path.is_dir():
        raise ConfigError([f"{key} = {str(path)!r}: is a file, not a directory; {fix}"])
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError([f"{key} = {str(path)!r}: cannot create it ({_reason(e)}); {fix}"]) from None
    try:
        fd, probe = tempfile.mkstemp(prefix=".rlplane-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError([f"{key} = {str(path)!r}: cannot write there ({_reason(e)}); {fix}"]) from None


def earlier_run(paths: RunPaths) -> list[str]:
    """What an earlier run left in these directories (relative names, for the message)."""
    found = [n for n in RUN_FILES if (paths.run_dir / n).is_file()]
    if paths.checkpoint_dir.is_dir():
        found += sorted(p.name for p in paths.checkpoint_dir.iterdir() if p.name.startswith(_CHECKPOINT_PREFIXES))
    metrics = paths.log_dir / METRICS_FILE
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append(f"{paths.log_dir.name}/{METRICS_FILE}")
    return found


def remove_earlier_run(paths: RunPaths) -> None:
    """Delete what :func:`earlier_run` finds (and the TensorBoard events), nothing else."""
    for n in RUN_FILES:
        (paths.run_dir / n).unlink(missing_ok=True)
    if paths.checkpoint_dir.is_dir():
        for p in paths.checkpoint_dir.iterdir():
            if p.name.startswith(_CHECKPOINT_PREFIXES) and p.is_dir():
                shutil.rmtree(p)
    (paths.log_dir / METRICS_FILE).unlink(missing_ok=True)
    shutil.rmtree(paths.log_dir / TENSORBOARD_DIR, ignore_errors=True)


def prepare_run_paths(cfg, *, overwrite: bool = False) -> RunPaths:
    """Resolve, create and probe the run's directories; refuse an earlier run there unless the run
    resumes (``checkpointing.resume``) or ``overwrite`` (which removes the earlier run's files)."""
    paths = run_paths(cfg)
    ensure_writable_dir(paths.run_dir, "run_dir")
    if cfg.checkpointing.enabled or cfg.checkpointing.resume:
        ensure_writable_dir(paths.checkpoint_dir, "checkpointing.checkpoint_dir")
    ensure_writable_dir(paths.log_dir, "logger.log_dir")
    if cfg.checkpointing.resume:
        return paths
    found = earlier_run(paths)
    if found and not overwrite:
        shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
        raise ConfigError([
            f"run_dir = {str(paths.run_dir)!r}: holds an earlier run ({shown}); pick a new run_dir, continue it "
            "with checkpointing.resume=true, or replace it with rlplane train --overwrite"
        ])
    if found:
        remove_earlier_run(paths)
    return paths
