"""Running a Python program as an unprivileged user from a test session run as root: a fresh system user with
no capabilities, for the cases where being root hides a mistake (a file or directory closed to the user).

The interpreter may sit below a directory only root can enter (pyenv under /root, 0700): the program then runs in
a private mount namespace where such a directory is a tmpfs holding just the needed child, bind-mounted from the
host. Its uid, capabilities and user namespace are those of any unprivileged user.

Loaded by path (``importlib``), as the tests load their other helpers.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import rlplane

USER = "rlplane-sbx"
SRC = str(Path(rlplane.__file__).resolve().parents[1])


def missing_reason() -> str | None:
    """Why this session cannot switch to an unprivileged user (None: it can)."""
    if os.geteuid() != 0:
        return "the tests already run unprivileged"
    missing = [t for t in ("useradd", "userdel", "unshare", "setpriv") if shutil.which(t) is None]
    if missing:
        return f"cannot switch to an unprivileged uid: {', '.join(missing)} not installed (util-linux, passwd)"
    return None


@contextlib.contextmanager
def system_user(name: str = USER) -> Iterator[pwd.struct_passwd]:
    """``name``, created for the block when it does not exist (and removed after)."""
    try:
        pwd.getpwnam(name)
        created = False
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True,
                       capture_output=True)
        created = True
    try:
        yield pwd.getpwnam(name)
    finally:
        if created:
            subprocess.run(["userdel", name], capture_output=True)


def blocked_ancestors(paths) -> dict[str, set[str]]:
    """Directories only root may enter (e.g. /root, 0700) on the way to ``paths`` -> the child needed in each."""
    blocked: dict[str, set[str]] = {}
    for path in paths:
        parts = Path(path).parts
        for i in range(1, len(parts)):
            directory = Path(*parts[:i])
            if not os.stat(directory).st_mode & 0o001:
                blocked.setdefault(str(directory), set()).add(parts[i])
    return blocked


def run_python_as(user: pwd.struct_passwd, args: list[str], *, hold: Path, home: Path, cwd: Path | None = None,
                  env: dict[str, str] | None = None, needed: tuple[str, ...] = (),
                  timeout: float = 300) -> subprocess.CompletedProcess:
    """``python ARGS`` as ``user`` (no capabilities, a clean environment: HOME, PATH, PYTHONPATH=src, ``env``);
    ``hold`` is scratch space for the mounts, ``home`` the user's home (made theirs), ``needed`` more paths the
    program reads that may sit below a directory closed to the user."""
    wanted = (sys.executable, sys.base_prefix, sys.prefix, SRC, *needed)
    blocked = blocked_ancestors({os.path.realpath(p) for p in wanted})
    lines = ["set -e", "mount --make-rprivate /"]
    for i, (directory, children) in enumerate(sorted(blocked.items())):
        for j, child in enumerate(sorted(children)):
            lines += [f"mkdir -p {hold}/{i}-{j}", f"mount --bind '{directory}/{child}' {hold}/{i}-{j}"]
        lines.append(f"mount -t tmpfs -o mode=0755 tmpfs '{directory}'")
        for j, child in enumerate(sorted(children)):
            lines += [f"mkdir -p '{directory}/{child}'", f"mount --move {hold}/{i}-{j} '{directory}/{child}'"]
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, user.pw_uid, user.pw_gid)
    if cwd is not None:
        lines.append(f"cd '{cwd}'")
    extra = " ".join(f"{k}='{v}'" for k, v in (env or {}).items())
    quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in args)
    lines.append(
        f"exec setpriv --reuid={user.pw_uid} --regid={user.pw_gid} --clear-groups --inh-caps=-all "
        f"env -i HOME={home} PATH=/usr/bin:/bin PYTHONPATH={SRC} OMP_NUM_THREADS=1 TMPDIR={home} {extra} "
        f"{sys.executable} {quoted}"
    )
    return subprocess.run(["unshare", "--mount", "sh", "-c", "\n".join(lines)], capture_output=True, text=True,
                          timeout=timeout)
