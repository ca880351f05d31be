"""Run untrusted Python (model-written code) in a separate, isolated and limited process.

The fence is the OS (:mod:`rlplane.envs._sandbox_runner`): network, IPC, UTS, PID and mount namespaces
with a tmpfs root (work dir, read-only stdlib), no privileges and ``no_new_privs``, rlimits, a wall-clock
kill of the process group, a scrubbed environment and an audit hook. Fail closed:
:class:`SandboxUnavailable` and nothing runs. Pass means the harness printed a nonce after the tests.
"""

from __future__ import annotations

import functools
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
    """What one run may use: CPU seconds (RLIMIT_CPU), wall seconds (then the group is killed), address space,
    output bytes per stream (RLIMIT_FSIZE), processes of the uid (1 = none), modules to preload, work dir size.
    """

    cpu_seconds: float = 2.0
    wall_seconds: float = 5.0
    memory_bytes: int = 512 * 2**20
    output_bytes: int = 64 * 2**10
    max_processes: int = 1
    preload_modules: tuple[str, ...] = DEFAULT_PRELOAD
    work_dir_bytes: int = 16 * 2**20
    audit_hook: bool = True  # off only in tests that check the OS layers on their own


class SandboxUnavailable(RuntimeError):
    """This machine cannot isolate a program (one-line message: what is missing and how to get it)."""


@dataclass
class SandboxResult:
    """How a run ended; ``ok``: code and tests ran to the end (nonce printed), exit 0, within every limit."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    wall_seconds: float
    isolation: dict = field(default_factory=dict)
    completed: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and self.completed

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
                line = next(ln for ln in f if ln.startswith("Uid:"))
            if int(line.split()[1]) == uid:
                os.kill(int(entry), signal.SIGKILL)
                found += 1
        except (OSError, StopIteration, ValueError):
            continue  # gone already, or not readable
    return found


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def _wait_gone(pid: int, timeout: float) -> None:
    """Until ``pid`` has exited (a zombie or reaped): a PID namespace's init exits after everything in it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] in ("Z", "X"):
                    return
        except OSError:
            return
        time.sleep(0.01)


def _read_head(path: Path, limit: int) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")


_HOW_TO_ISOLATE = (
    "the code sandbox needs Linux namespaces: as a normal user, allow unprivileged user namespaces "
    "(sysctl -w user.max_user_namespaces=15000; on Ubuntu 23.10+ also kernel.apparmor_restrict_unprivileged_userns=0); "
    "in a container, run it with --security-opt seccomp=unconfined (Docker) or as root with CAP_SYS_ADMIN"
)


def _unavailable(status: dict, stderr: str) -> SandboxUnavailable:
    what = status.get("error") or (stderr.strip().splitlines() or ["the sandbox's runner did not start"])[-1]
    return SandboxUnavailable(f"code sandbox: no OS isolation on this machine ({what}); {_HOW_TO_ISOLATE}")


def run_python(code: str, limits: SandboxLimits = SandboxLimits(), tests: str = "") -> SandboxResult:
    """Run ``code`` as ``__main__`` in an isolated child, then ``tests`` in its namespace; raises
    :class:`SandboxUnavailable` (running nothing) without isolation."""
    root = Path(tempfile.mkdtemp(prefix="rlplane-sandbox-"))
    (root / "newroot").mkdir()
    uid = _UID_BASE + secrets.randbelow(_UID_SPAN) if os.geteuid() == 0 else None
    (root / "solution.py").write_text(code)
    (root / "tests.py").write_text(tests)
    nonce = secrets.token_hex(16)
    spec = {
        "code_path": str(root / "solution.py"),
        "tests_path": str(root / "tests.py"),
        "new_root": str(root / "newroot"),
        "status_path": str(root / "status.json"),
        "nonce": nonce,
        "uid": uid,
        "cpu_seconds": limits.cpu_seconds,
        "memory_bytes": int(limits.memory_bytes),
        "file_size_bytes": int(limits.output_bytes) + 64,  # room for the nonce's line after a full output
        "max_processes": int(limits.max_processes),
        "work_dir_bytes": int(limits.work_dir_bytes),
        "preload_modules": list(limits.preload_modules),
        "audit_hook": limits.audit_hook,
    }
    spec_path = root / "spec.json"
    spec_path.touch(mode=0o600)
    spec_path.write_text(json.dumps(spec))  # the runner deletes it once read
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/work", "TMPDIR": "/work",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8", "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1"}
    out_path, err_path = root / "stdout", root / "stderr"
    t0 = time.perf_counter()
    timed_out = False
    try:
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(_RUNNER), str(spec_path)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, cwd="/",
                start_new_session=True, close_fds=True,
            )
            try:
                returncode = proc.wait(timeout=limits.wall_seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
                returncode = None
            finally:
                init = _children(proc.pid)  # the PID namespace's init, while the outer still lives
                try:
                    os.killpg(proc.pid,
                              signal.SIGKILL)  # the outer and the init (the program, unless it left the group)
                except ProcessLookupError:
                    pass
                for pid in init:  # the kernel kills the namespace's processes before its init is gone
                    _wait_gone(pid, timeout=10.0)
                if uid is not None:
                    _sweep_uid(uid)
                if returncode is None:
                    proc.wait()
                    returncode = proc.returncode
        elapsed = time.perf_counter() - t0
        stdout = _read_head(out_path, limits.output_bytes + 64)
        stderr = _read_head(err_path, limits.output_bytes)
        status = root / "status.json"
        isolation = json.loads(status.read_text() or "{}") if status.exists() else {}
        if "mechanism" not in isolation or "error" in isolation:
            raise _unavailable(isolation, stderr)
        tail = f"\n{nonce}\n"
        completed = stdout.endswith(tail)
        stdout = stdout[: -len(tail)] if completed else stdout[: limits.output_bytes]
        return SandboxResult(returncode, stdout, stderr, timed_out, elapsed, isolation, completed)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@functools.cache
def check_isolation() -> str:
    """The isolation mechanism this machine gives (run once per process); raises :class:`SandboxUnavailable`."""
    result = run_python("pass", SandboxLimits(cpu_seconds=5, wall_seconds=30))
    if not result.ok:
        raise SandboxUnavailable("code sandbox: a trivial program failed in the sandbox "
                                 f"({result.stderr.strip()[-300:]!r}); "
                                 "report it with this line")
    return result.isolation["mechanism"]
