"""Run untrusted Python (model-written code) in a separate, limited process.

Layers, each covering for the others:

- **resource limits** (``setrlimit`` in the child): CPU seconds, address space, file size (stdout and
  stderr are files, so this also caps output), no core dumps, 64 open files, and (with its own uid)
  the number of processes;
- **wall clock**: the parent waits ``wall_seconds`` and then kills the child's whole process group;
- **a fresh temporary directory** as the working directory, removed afterwards;
- **a scrubbed environment**: the child gets a fixed handful of variables, never the parent's;
- **an audit hook** (PEP 578) installed before the program runs: it refuses new processes, signals
  to other processes, sockets, ``ctypes``, and file access outside the work directory (reads are
  also allowed under the interpreter's own directories);
- when the parent runs as root (containers): a **fresh network namespace** (no interfaces) and a
  **throwaway uid** that owns nothing else, so file permissions fence the program in, the process
  limit is per-run, and every process left with that uid is killed afterwards.

Nothing outlives :func:`run_python`: the process group is killed, and processes of the run's uid
(if it had one) are found in ``/proc`` and killed too. An audit hook alone is not a security boundary
(CPython's own docs say so); the OS layers are what hold when it is bypassed. Modules are imported
before the hook goes in (``preload_modules``); the program can import those and the standard library
files its uid can read.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

_RUNNER = Path(__file__).with_name("_sandbox_runner.py")
_UID_BASE, _UID_SPAN = 1_000_000, 1_000_000  # throwaway uids: no account, no files, no other processes
DEFAULT_PRELOAD = ("math", "cmath", "itertools", "functools", "collections", "heapq", "bisect", "re", "string",
                   "random", "statistics", "fractions", "decimal", "json", "operator", "copy", "typing",
                   "dataclasses", "textwrap")


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use.

    cpu_seconds: CPU time (RLIMIT_CPU; SIGXCPU, then SIGKILL a second later).
    wall_seconds: elapsed time before the process group is killed (sleeping or blocked programs).
    memory_bytes: address space (RLIMIT_AS); allocations beyond it raise MemoryError.
    output_bytes: stdout and stderr, each (RLIMIT_FSIZE; writing past it kills the program with SIGXFSZ).
    max_processes: processes of the run's uid (RLIMIT_NPROC; 1 = no child processes or threads).
    preload_modules: imported before the program runs (its uid may not be able to read the stdlib).
    """

    cpu_seconds: float = 2.0
    wall_seconds: float = 5.0
    memory_bytes: int = 512 * 2**20
    output_bytes: int = 64 * 2**10
    max_processes: int = 1
    preload_modules: tuple[str, ...] = DEFAULT_PRELOAD
    audit_hook: bool = True  # off only in tests that check the OS layers on their own


@dataclass
class SandboxResult:
    """How a run ended. ``ok``: exit status 0 within every limit."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    wall_seconds: float
    isolation: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    @property
    def killed_by(self) -> str | None:
        """The signal's name when the program was killed by one (SIGXCPU, SIGKILL, SIGXFSZ, SIGSEGV ...)."""
        if self.returncode is not None and self.returncode < 0:
            return signal.Signals(-self.returncode).name
        return None


def _sweep_uid(uid: int) -> int:
    """Kill every process owned by ``uid``; returns how many were found."""
    found = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                line = next(l for l in f if l.startswith("Uid:"))
            if int(line.split()[1]) == uid:
                os.kill(int(entry), signal.SIGKILL)
                found += 1
        except (OSError, StopIteration, ValueError):
            continue  # gone already, or not readable
    return found


def _read_head(path: Path, limit: int) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run ``code`` as ``__main__`` in a sandboxed child process and return how it ended."""
    root = Path(tempfile.mkdtemp(prefix="rlplane-sandbox-"))
    work = root / "work"
    work.mkdir()
    as_root = os.geteuid() == 0
    uid = _UID_BASE + secrets.randbelow(_UID_SPAN) if as_root else None
    if uid is not None:
        os.chmod(root, 0o711)  # the child may pass through to work/, and see nothing else here
        os.chown(work, uid, uid)
    code_path = root / "solution.py"
    code_path.write_text(code)
    os.chmod(code_path, 0o600)
    read_roots = sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, *sys.path) if p} - {"/"})
    spec = {
        "code_path": str(code_path),
        "work_dir": str(work),
        "status_path": str(root / "status.json"),
        "uid": uid,
        "cpu_seconds": limits.cpu_seconds,
        "memory_bytes": int(limits.memory_bytes),
        "file_size_bytes": int(limits.output_bytes),
        "max_processes": int(limits.max_processes),
        "preload_modules": list(limits.preload_modules),
        "read_roots": read_roots,
        "audit_hook": limits.audit_hook,
    }
    (root / "spec.json").write_text(json.dumps(spec))
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(work), "TMPDIR": str(work),
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8", "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1"}
    out_path, err_path = root / "stdout", root / "stderr"
    t0 = time.perf_counter()
    timed_out = False
    try:
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", str(_RUNNER), str(root / "spec.json")],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, cwd=str(work),
                start_new_session=True, close_fds=True,
            )
            try:
                returncode = proc.wait(timeout=limits.wall_seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
                returncode = None
            finally:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # the whole group: anything it started goes too
                except ProcessLookupError:
                    pass
                if uid is not None:
                    _sweep_uid(uid)
                if returncode is None:
                    proc.wait()
                    returncode = proc.returncode
        elapsed = time.perf_counter() - t0
        stdout = _read_head(out_path, limits.output_bytes)
        stderr = _read_head(err_path, limits.output_bytes)
        status = root / "status.json"
        isolation = json.loads(status.read_text()) if status.exists() else {}
        return SandboxResult(returncode, stdout, stderr, timed_out, elapsed, isolation)
    finally:
        shutil.rmtree(root, ignore_errors=True)
