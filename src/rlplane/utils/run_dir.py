"""The run directory and the paths under it, checked before anything slow starts.

:func:`prepare_run_paths` makes run, checkpoint and log dirs absolute, probes that each is writable,
locks ``run_dir`` (:class:`RunLock`), and refuses an earlier run there unless resuming or
``--overwrite``, which deletes only what that run's manifest (``.rlplane-run.json``) names.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rlplane.errors import ConfigError

RUN_FILES = ("config.yaml", "summary.json")
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
SFT_DIR = "sft"
LOCK_FILE = ".rlplane.lock"
MANIFEST_FILE = ".rlplane-run.json"
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
    """Create ``path`` and write and remove a probe file; a :class:`ConfigError` naming ``key`` if either fails."""
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


class RunLock:
    """An exclusive ``fcntl.flock`` on ``run_dir/.rlplane.lock`` (holding pid and host) for the run's life.

    The OS drops it when the process ends, however it ends; re-entrant within a process."""

    _held: dict[Path, tuple[int, int]] = {}  # run_dir -> (fd, depth) held by this process

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE

    def acquire(self) -> RunLock:
        if self.run_dir in RunLock._held:
            fd, depth = RunLock._held[self.run_dir]
            RunLock._held[self.run_dir] = (fd, depth + 1)
            return self
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError([f"run_dir = {str(self.run_dir)!r}: cannot create its lock file ({_reason(e)}); "
                               "set run_dir to a directory you can write"]) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace")
            os.close(fd)
            try:
                who = json.loads(holder)
                shown = f"pid {who['pid']} on host {who['host']}, started {who['started']}"
            except (ValueError, KeyError, TypeError):
                shown = "a process that has not written its pid yet"
            raise ConfigError([f"run_dir = {str(self.run_dir)!r}: another rlplane run is using it ({shown}); "
                               "wait for it to end or pick another run_dir"]) from None
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
        except OSError as e:  # a full disk or quota: the lock is not kept, and its file not left open
            os.close(fd)
            raise ConfigError([f"run_dir = {str(self.run_dir)!r}: cannot write its lock file ({e.strerror}); free "
                               "space there or pick another run_dir"]) from None
        RunLock._held[self.run_dir] = (fd, 1)
        return self

    def release(self) -> None:
        if self.run_dir not in RunLock._held:
            return
        fd, depth = RunLock._held.pop(self.run_dir)
        if depth > 1:
            RunLock._held[self.run_dir] = (fd, depth - 1)
            return
        os.close(fd)  # closing the descriptor drops the flock

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def release_run_dir(run_dir: Path) -> None:
    """Give back one hold of ``run_dir``'s lock taken by :func:`prepare_run_paths`."""
    RunLock(Path(run_dir)).release()


@dataclass(frozen=True)
class Manifest:
    """What a run writes: paths, and checkpoint directories under ``checkpoint_dir`` (None: a run that saves
    none claims none there); stored relative to run_dir so a moved run directory still owns its files."""

    paths: tuple[Path, ...]
    checkpoint_dir: Path | None

    @classmethod
    def of(cls, paths: RunPaths, checkpoints: bool = True) -> Manifest:
        run, logs = paths.run_dir, paths.log_dir
        owned = [run / n for n in (*RUN_FILES, SFT_DIR)] + [logs / METRICS_FILE, logs / TENSORBOARD_DIR]
        return cls(tuple(owned), paths.checkpoint_dir if checkpoints else None)

    def names(self, path: Path) -> bool:
        return path in self.paths or (path.parent == self.checkpoint_dir and path.name.startswith(_CHECKPOINT_PREFIXES))

    def write(self, run_dir: Path) -> None:
        def rel(p: Path) -> str:
            return str(p.relative_to(run_dir)) if p.is_relative_to(run_dir) else str(p)

        data = {"written_by": "rlplane", "paths": [rel(p) for p in self.paths],
                "checkpoint_dir": None if self.checkpoint_dir is None else rel(self.checkpoint_dir)}
        (run_dir / MANIFEST_FILE).write_text(json.dumps(data, indent=1) + "\n")


def read_manifest(run_dir: Path) -> Manifest | None:
    """The manifest an earlier run left in ``run_dir`` (None: none, or not one rlplane wrote)."""
    try:
        data = json.loads((run_dir / MANIFEST_FILE).read_text(encoding="utf-8"))
        checkpoints = None if data["checkpoint_dir"] is None else run_dir / data["checkpoint_dir"]
        return Manifest(tuple(run_dir / p for p in data["paths"]), checkpoints)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def earlier_run(paths: RunPaths) -> list[Path]:
    """What an earlier run left in these directories (absolute paths)."""
    found = [paths.run_dir / n for n in RUN_FILES if (paths.run_dir / n).is_file()]
    if paths.checkpoint_dir.is_dir():
        found += sorted(p for p in paths.checkpoint_dir.iterdir() if p.name.startswith(_CHECKPOINT_PREFIXES))
    metrics = paths.log_dir / METRICS_FILE
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append(metrics)
    return found


def _shown(found: list[Path], base: Path) -> str:
    names = [str(p.relative_to(base)) if p.is_relative_to(base) else str(p) for p in found]
    return ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")


def _foreign_message(paths: RunPaths, foreign: list[Path]) -> str:
    """One line naming the files no manifest of run_dir names, and whose they look."""
    in_ck = [p for p in foreign if p.parent == paths.checkpoint_dir]
    if in_ck:
        owner = next((d for d in (paths.checkpoint_dir, *paths.checkpoint_dir.parents)
                      if d != paths.run_dir and (m := read_manifest(d)) is not None and m.names(in_ck[0])), None)
        whose = f"the run in {str(owner)!r}" if owner else "another run (run_dir's manifest does not name them)"
        return (f"checkpointing.checkpoint_dir = {str(paths.checkpoint_dir)!r}: holds checkpoints of {whose} "
                f"({_shown(in_ck, paths.checkpoint_dir)}); rlplane will not delete or mix with them: "
                "pick another checkpoint_dir (or resume that run from its own run_dir)")
    d = foreign[0].parent
    key = "run_dir" if d == paths.run_dir else "logger.log_dir"
    return (f"{key} = {str(d)!r}: holds {_shown(foreign, d)}, which no earlier rlplane run there wrote (its "
            f"{MANIFEST_FILE} does not name them); rlplane would replace them: pick another {key}, or move them")


def remove_earlier_run(paths: RunPaths, manifest: Manifest, found: list[Path], say=None) -> None:
    """Delete the earlier run's files that the manifest names (and its TensorBoard events), saying each."""
    say = say or (lambda m: print(m, file=sys.stderr, flush=True))
    tb = paths.log_dir / TENSORBOARD_DIR
    for p in [*found, *([tb] if tb.exists() and manifest.names(tb) else [])]:
        say(f"rlplane: --overwrite: deleting {p}")
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)


def prepare_run_paths(cfg, *, overwrite: bool = False) -> RunPaths:
    """Resolve, create and probe the run's directories and lock run_dir (undo: :func:`release_run_dir`);
    refuse an earlier run unless ``checkpointing.resume`` or ``overwrite`` (deletes what its manifest names)."""
    paths = run_paths(cfg)
    ensure_writable_dir(paths.run_dir, "run_dir")
    if cfg.checkpointing.enabled or cfg.checkpointing.resume:
        ensure_writable_dir(paths.checkpoint_dir, "checkpointing.checkpoint_dir")
    ensure_writable_dir(paths.log_dir, "logger.log_dir")
    lock = RunLock(paths.run_dir).acquire()  # before anything in run_dir is judged or deleted
    try:
        _check_earlier_run(cfg, paths, overwrite)
    except BaseException:
        lock.release()
        raise
    return paths


def _check_earlier_run(cfg, paths: RunPaths, overwrite: bool) -> None:
    saves = cfg.checkpointing.enabled or cfg.checkpointing.resume
    mine = Manifest.of(paths, checkpoints=saves)
    if cfg.checkpointing.resume:
        if read_manifest(paths.run_dir) is None:
            mine.write(paths.run_dir)
        return
    found = earlier_run(paths)
    manifest = read_manifest(paths.run_dir)
    foreign = [p for p in found if manifest is None or not manifest.names(p)]
    if not saves:  # it writes no checkpoints: another run's there (a shared dir) stay untouched
        found = [p for p in found if p not in foreign or p.parent != paths.checkpoint_dir]
        foreign = [p for p in foreign if p in found]
    if foreign:
        raise ConfigError([_foreign_message(paths, foreign)])
    if found and not overwrite:
        raise ConfigError([
            f"run_dir = {str(paths.run_dir)!r}: holds an earlier run ({_shown(found, paths.run_dir)}); pick a new "
            "run_dir, continue it with checkpointing.resume=true, or replace it with rlplane train --overwrite"
        ])
    if found:
        remove_earlier_run(paths, manifest, found)
    mine.write(paths.run_dir)
