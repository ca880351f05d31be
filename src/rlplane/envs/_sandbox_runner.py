"""Run inside the sandbox's child process (``python -I _sandbox_runner.py SPEC.json``); not imported.

Order matters: everything that needs privileges (a fresh network namespace, a throwaway uid) happens
first, then the resource limits, then the modules the program may use are imported while the
interpreter's files can still be read, then the audit hook goes in, and only then does the
program's code run. Standard library only: this file runs under ``-I`` with no site-packages path.
"""

import builtins
import json
import os
import resource
import sys

_BLOCKED_EVENTS = {
    # new processes (fork bomb, a child that outlives the run, shelling out)
    "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen", "pty.spawn",
    # signals to other processes (the parent is one)
    "os.kill", "os.killpg", "signal.pthread_kill",
    # network
    "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
    "socket.gethostbyaddr", "socket.sendto", "socket.sendmsg",
    # raising the limits back, or leaving the work directory's files
    "resource.setrlimit", "resource.prlimit", "os.chroot", "os.setuid", "os.setgid",
}
_BLOCKED_IMPORTS = {"ctypes", "_ctypes", "_posixsubprocess", "socket", "_socket", "multiprocessing", "subprocess",
                    "pty", "mmap", "_xxsubinterpreters"}
# Events whose path arguments must stay inside the work directory.
_WRITE_EVENTS = {"os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.symlink", "os.link", "os.chmod", "os.chown",
                 "os.truncate", "os.utime", "os.chflags", "os.lchflags", "shutil.rmtree", "shutil.copyfile",
                 "shutil.copymode", "shutil.copystat", "shutil.copytree", "shutil.move", "os.mkfifo", "os.mknod"}
_READ_EVENTS = {"os.listdir", "os.scandir", "glob.glob", "os.chdir"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_CLONE_NEWNET = 0x40000000


def _new_network_namespace() -> bool:
    """An empty network namespace (no interfaces but a down loopback): connect() has nowhere to go."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        ok = libc.unshare(_CLONE_NEWNET) == 0
    except Exception:  # no libc symbol, no privilege: the audit hook still blocks sockets
        ok = False
    for name in [m for m in sys.modules if m == "ctypes" or m.startswith("ctypes.") or m == "_ctypes"]:
        del sys.modules[name]  # so the program's own `import ctypes` is a fresh (blocked) import
    return ok


def _set_limits(spec: dict) -> None:
    def cap(which, value):
        resource.setrlimit(which, (value, value))

    cpu = max(1, int(spec["cpu_seconds"]))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at the soft limit, SIGKILL one second later
    cap(resource.RLIMIT_AS, spec["memory_bytes"])
    cap(resource.RLIMIT_FSIZE, spec["file_size_bytes"])  # also caps stdout/stderr: they are files
    cap(resource.RLIMIT_CORE, 0)
    cap(resource.RLIMIT_NOFILE, 64)
    if spec["uid"] is not None:  # per-uid: only meaningful once this process has a uid of its own
        cap(resource.RLIMIT_NPROC, spec["max_processes"])


def _inside(path, roots) -> bool:
    if isinstance(path, int):
        return True  # an already open descriptor
    try:
        real = os.path.realpath(os.fsdecode(os.fspath(path)))
    except (TypeError, ValueError):
        return False
    return any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots)


def _install_audit_hook(work: str, read_roots: list[str]) -> None:
    writable = [work]
    readable = [work, *read_roots]

    def hook(event, args):
        if event in _BLOCKED_EVENTS or event.startswith("ctypes."):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args[0].split(".")[0] in _BLOCKED_IMPORTS:
            raise ImportError(f"sandbox: import of {args[0]} is not allowed")
        if event == "open":
            path, mode, flags = args
            writes = (mode is not None and any(c in mode for c in "wax+")) or bool((flags or 0) & _WRITE_FLAGS)
            if not _inside(path, writable if writes else readable):
                raise PermissionError(f"sandbox: {'writing' if writes else 'reading'} {path!r} is not allowed")
        elif event in _WRITE_EVENTS:
            for a in args:
                if isinstance(a, (str, bytes, os.PathLike)) and not _inside(a, writable):
                    raise PermissionError(f"sandbox: {event} on {a!r} is not allowed")
        elif event in _READ_EVENTS:
            for a in args[:1]:
                if isinstance(a, (str, bytes, os.PathLike)) and not _inside(a, readable):
                    raise PermissionError(f"sandbox: {event} on {a!r} is not allowed")

    sys.addaudithook(hook)


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    with open(spec["code_path"]) as f:
        code = f.read()
    netns = _new_network_namespace() if os.geteuid() == 0 else False
    _set_limits(spec)
    with open(spec["status_path"], "w") as f:  # what isolation this machine allowed, for the parent to report
        json.dump({"network_namespace": netns, "own_uid": spec["uid"] is not None}, f)
    # Import while the interpreter's files are still readable (a throwaway uid may not read them).
    import traceback  # noqa: F401  (reports the program's exception)

    for name in spec["preload_modules"]:
        try:
            __import__(name)
        except Exception:
            pass
    if spec["uid"] is not None:  # a uid no other process has: no file of ours is its, and it can be swept after
        os.setgroups([])
        os.setgid(spec["uid"])
        os.setuid(spec["uid"])
    os.chdir(spec["work_dir"])
    os.umask(0o077)
    if spec["audit_hook"]:
        _install_audit_hook(spec["work_dir"], spec["read_roots"])
    sys.argv = ["solution.py"]
    compiled = compile(code, "solution.py", "exec")
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compiled, namespace)
    except SystemExit:
        raise
    except BaseException:
        sys.modules["traceback"].print_exc()
        sys.stderr.flush()
        os._exit(1)


if __name__ == "__main__":
    main()
