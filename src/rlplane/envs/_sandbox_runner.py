"""Run inside the sandbox's child process (``python -I -S _sandbox_runner.py SPEC.json``); not imported.

Three processes, so the one running the program holds no privilege or secret: the outer enters fresh
namespaces and forks; the namespace's init builds and ``pivot_root``s into a tmpfs root and forks; the
program drops privileges, sets limits and the audit hook, runs code and tests, prints the nonce. Any
failed isolation step means the program never runs (fail closed). Standard library only.
"""

import builtins
import ctypes
import errno
import json
import os
import resource
import signal
import sys
import types

_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
_CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_NOATIME, _MS_NODIRATIME, _MS_BIND, _MS_REC, _MS_PRIVATE, _MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
_MNT_DETACH = 2
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
# statvfs flags that a bind remount must keep (a user namespace may not clear them): ST_* -> MS_*
_KEPT_FLAGS = {1: _MS_RDONLY, 2: _MS_NOSUID, 4: _MS_NODEV, 8: _MS_NOEXEC, 1024: _MS_NOATIME, 2048: _MS_NODIRATIME,
               4096: _MS_RELATIME}
_LIB_DIRS = ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/lib32",
             "/usr/lib32")  # shared libraries of extension modules
_DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")

_BLOCKED_EVENTS = {
    "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen", "pty.spawn",
    "os.kill", "os.killpg", "signal.pthread_kill",
    "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
    "socket.gethostbyaddr", "socket.sendto", "socket.sendmsg",
    "resource.setrlimit", "resource.prlimit", "os.chroot", "os.setuid", "os.setgid",
}
_BLOCKED_IMPORTS = {"ctypes", "_ctypes", "_posixsubprocess", "socket", "_socket", "multiprocessing", "subprocess",
                    "pty", "mmap", "_xxsubinterpreters", "sqlite3", "_sqlite3"}
_WRITE_EVENTS = {"os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.symlink", "os.link", "os.chmod", "os.chown",
                 "os.truncate", "os.utime", "os.chflags", "os.lchflags", "shutil.rmtree", "shutil.copyfile",
                 "shutil.copymode", "shutil.copystat", "shutil.copytree", "shutil.move", "os.mkfifo", "os.mknod"}
_READ_EVENTS = {"os.listdir", "os.scandir", "glob.glob", "os.chdir"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

_libc = ctypes.CDLL(None, use_errno=True)


class IsolationError(Exception):
    """A step of the OS isolation failed: the program must not run."""


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise IsolationError(f"{what} failed: {errno.errorcode.get(err, err)} ({os.strerror(err)})")


def _mount(source, target, fstype, flags, data=None) -> None:
    enc = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {fstype or source} on {target}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _enter_namespaces() -> str:
    """Network, IPC, UTS and PID namespaces (a user namespace first when not root); returns the mechanism's name."""
    flags = _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS | _CLONE_NEWPID
    if os.geteuid() == 0:
        _check(_libc.unshare(flags), "unshare(network, ipc, uts, pid namespaces)")
        return "namespaces (root)"
    uid, gid = os.geteuid(), os.getegid()
    _check(_libc.unshare(_CLONE_NEWUSER | flags), "unshare(CLONE_NEWUSER): unprivileged user namespaces")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1\n")  # the same uid inside: never root there
    _write("/proc/self/gid_map", f"{gid} {gid} 1\n")
    return "user namespace"


def _bind_read_only(source: str, target: str) -> None:
    _mount(source, target, None, _MS_BIND | _MS_REC)
    kept = sum(ms for st, ms in _KEPT_FLAGS.items() if os.statvfs(target).f_flag & st)
    _mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | kept)


def _build_root(new_root: str, spec: dict) -> None:
    """A tmpfs root holding only the work directory, the standard library, shared libraries and a few devices."""
    _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing we mount propagates back to the host
    _mount("tmpfs", new_root, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=0755")
    inside = lambda p: new_root + p  # noqa: E731
    owner = f",uid={spec['uid']},gid={spec['uid']}" if spec["uid"] is not None else ""
    os.makedirs(inside("/work"))
    _mount("tmpfs", inside("/work"), "tmpfs", _MS_NOSUID | _MS_NODEV,
           f"size={spec['work_dir_bytes']},mode=0700{owner}")
    for path in _LIB_DIRS:
        if os.path.islink(path):
            os.makedirs(os.path.dirname(inside(path)), exist_ok=True)
            os.symlink(os.readlink(path), inside(path))
        elif os.path.isdir(path):
            os.makedirs(inside(path), exist_ok=True)
            _bind_read_only(path, inside(path))
    for path in spec["read_roots"]:  # the standard library, unless a library directory above already holds it
        if not any(path == d or path.startswith(d + "/") for d in _LIB_DIRS if os.path.isdir(d)):
            os.makedirs(inside(path), exist_ok=True)
            _bind_read_only(path, inside(path))
    for path in ("/etc/ld.so.cache",) + _DEVICES:
        if os.path.exists(path):
            os.makedirs(os.path.dirname(inside(path)), exist_ok=True)
            open(inside(path), "w").close()
            if path.startswith("/dev/"):
                _mount(path, inside(path), None, _MS_BIND)  # writable: /dev/null takes output
            else:
                _bind_read_only(path, inside(path))
    os.chdir(new_root)
    _check(_libc.syscall(_SYS_PIVOT_ROOT[os.uname().machine], b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", _MNT_DETACH), "detaching the old root")
    os.chdir("/")
    _mount(None, "/", None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)


def _drop_privileges(spec: dict) -> None:
    """Root: become the run's throwaway uid (no capabilities). Otherwise: drop the user namespace's capabilities."""
    if spec["uid"] is not None:
        os.setgroups([])
        os.setgid(spec["uid"])
        os.setuid(spec["uid"])
    else:
        for cap in range(64):
            if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == errno.EINVAL:
                break  # past the last capability this kernel knows
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
        _check(_libc.capset(header, (ctypes.c_uint32 * 6)()), "capset (dropping capabilities)")
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    header, caps = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
    _check(_libc.capget(header, caps), "capget")
    if os.geteuid() == 0 or any(caps):
        raise IsolationError("the program would still hold privileges")


def _set_limits(spec: dict) -> None:
    def cap(which, value):
        resource.setrlimit(which, (value, value))

    cpu = max(1, int(spec["cpu_seconds"]))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at the soft limit, SIGKILL one second later
    cap(resource.RLIMIT_AS, spec["memory_bytes"])
    cap(resource.RLIMIT_FSIZE, spec["file_size_bytes"])  # also caps stdout/stderr: they are files
    cap(resource.RLIMIT_CORE, 0)
    cap(resource.RLIMIT_NOFILE, 64)
    cap(resource.RLIMIT_NPROC, spec["max_processes"])  # counted per uid in this user namespace (or throwaway uid)


def _inside(path, roots) -> bool:
    if isinstance(path, int):
        return True  # an already open descriptor
    try:
        real = os.path.realpath(os.fsdecode(os.fspath(path)))
    except (TypeError, ValueError):
        return False
    return any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots)


def _install_audit_hook(read_roots: list[str]) -> None:
    """A further layer: refuses processes, signals, sockets, ctypes and paths outside /work with a clear message."""
    writable = ["/work"]
    readable = ["/work", *read_roots]

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


def _run_stage(source: str, filename: str, namespace: dict) -> None:
    """Run one stage; any exception, ``SystemExit`` included, fails the run with exit status 1."""
    try:
        exec(compile(source, filename, "exec"), namespace)
    except SystemExit as e:
        sys.stderr.write(f"sandbox: {filename} raised SystemExit({e.code!r}); exiting is a failure here\n")
    except BaseException:
        sys.modules["traceback"].print_exc()
    else:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def _program(spec: dict, code: str, tests: str, nonce_fd: int) -> None:
    _drop_privileges(spec)
    _set_limits(spec)
    import traceback  # noqa: F401  (reports the program's exception)

    for name in spec["preload_modules"]:
        try:
            __import__(name)
        except Exception:
            pass
    os.chdir("/work")
    os.umask(0o077)
    if spec["audit_hook"]:
        _install_audit_hook(spec["read_roots"])
    sys.argv = ["solution.py"]
    main_module = types.ModuleType("__main__")  # `import __main__` names the program, not this runner
    sys.modules["__main__"] = main_module
    namespace = main_module.__dict__
    namespace["__builtins__"] = builtins
    _run_stage(code, "solution.py", namespace)
    _run_stage(tests, "tests.py", namespace)
    sys.stdout.write("\n" + os.read(nonce_fd, 64).decode() + "\n")
    sys.stdout.flush()
    os._exit(0)


def _init(spec: dict, code: str, tests: str, status_fd: int, nonce_fd: int) -> None:
    """PID 1 of the new namespace: build the root, start the program, report how it ended, exit."""
    # Dies with the outer (had it died already, the parent's process-group kill reaches this one).
    _check(_libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    status = {"mechanism": spec["mechanism"]}
    try:
        _build_root(spec["new_root"], spec)
        _libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)  # the program may not ptrace or read this process
    except (IsolationError, OSError) as e:
        status["error"] = str(e)
    os.write(status_fd, json.dumps(status).encode())
    os.close(status_fd)
    if "error" in status:
        os._exit(3)
    pid = os.fork()
    if pid == 0:
        try:
            _program(spec, code, tests, nonce_fd)
        except IsolationError as e:
            sys.stderr.write(f"sandbox: {e}\n")
            os._exit(3)
    os.close(nonce_fd)
    while True:  # reap everything; the program's status decides the run's
        try:
            child, wait_status = os.wait()
        except ChildProcessError:
            break
        if child == pid:
            break
    os._exit(os.waitstatus_to_exitcode(wait_status) % 256 if os.WIFEXITED(wait_status)
             else 128 + os.WTERMSIG(wait_status))


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    with open(spec["code_path"]) as f:
        code = f.read()
    with open(spec["tests_path"]) as f:
        tests = f.read()
    # Only the standard library (-I -S): the interpreter's own directories, nothing from a venv or site-packages.
    roots = sorted({os.path.realpath(p) for p in sys.path if os.path.isdir(p)})
    spec["read_roots"] = [r for r in roots if not any(r.startswith(o + "/") for o in roots)]  # outermost only
    nonce_read, nonce_write = os.pipe()
    os.write(nonce_write, spec.pop("nonce").encode())
    os.close(nonce_write)
    status_fd = os.open(spec["status_path"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.unlink(sys.argv[1])  # the nonce's only copy on disk
    try:
        spec["mechanism"] = _enter_namespaces()
    except (IsolationError, OSError) as e:
        os.write(status_fd, json.dumps({"error": str(e)}).encode())
        os._exit(3)
    pid = os.fork()
    if pid == 0:
        _init(spec, code, tests, status_fd, nonce_read)
    os.close(status_fd)
    os.close(nonce_read)
    _, wait_status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(wait_status)
    if code >= 128:  # the program died of a signal: die of it too, so the parent sees which
        signal.signal(code - 128, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.kill(os.getpid(), code - 128)
    os._exit(code if code >= 0 else 1)


if __name__ == "__main__":
    main()
