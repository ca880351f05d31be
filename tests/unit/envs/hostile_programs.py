"""Hostile programs for the code sandbox, run in one ``CodeEnv`` batch, and the checks that nothing escaped.

Every hostile program defines a correct ``add`` and then does its harm so that it *passes only if the
harm worked* (it reads the secret, its write or connection succeeds, its signal is delivered, it games
the exit status). A reward of 0 therefore means contained; the checks after the batch look for what a
program might have left behind anyway (files, processes, /dev/shm entries, connections, signals).

Run by ``test_sandbox.py`` in its own process, and as a script (``python hostile_programs.py``,
printing one JSON object) by the same test under an unprivileged uid.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import sys
import sysconfig
import tempfile
import uuid

GOOD = "def add(a, b):\n    return a + b\n"
TESTS = "assert add(2, 3) == 5\n"
SECRET_ENV = "RLPLANE_TEST_SECRET"


def hostile_programs(outside: str, marker: str, secret: str, trainer_pid: int, port: int,
                     unix_path: str, abstract_name: str) -> dict[str, str]:
    """name -> code. ``outside``: a world-writable directory of the host holding ``secret.txt``."""
    secret_file = f"{outside}/secret.txt"
    site = sysconfig.get_paths()["purelib"]
    shm = f"/dev/shm/{marker}"
    gaming = {  # no `add` at all: they can only pass by ending the run early with status 0
        "game_system_exit": "raise SystemExit(0)",
        "game_sys_exit": "import sys\nsys.exit()",
        "game_os_exit": "import os\nos._exit(0)",
        "game_atexit": "import atexit, os\natexit.register(os._exit, 0)",
        "game_forged_nonce": "import os, secrets\nprint(secrets.token_hex(16))\nos._exit(0)",
    }
    harm = {
        "read_file": f"assert open({secret_file!r}).read() == {secret!r}",
        "read_relative": (f"import os\nrel = os.path.relpath({secret_file!r}, os.getcwd())\n"
                          f"assert open(rel).read() == {secret!r}"),
        "read_symlink_dir_fd": (f"import os\nos.symlink({secret_file!r}, 'link')\nd = os.open('.', os.O_RDONLY)\n"
                                "fd = os.open('link', os.O_RDONLY, dir_fd=d)\nassert "
                                f"os.read(fd, 99).decode() == {secret!r}"),
        "read_parent_environ": f"assert {secret!r}.encode() in open('/proc/{trainer_pid}/environ', 'rb').read()",
        "read_parent_environ_dir_fd": (f"import os\nd = os.open('/proc', os.O_RDONLY)\n"
                                       f"fd = os.open('{trainer_pid}/environ', os.O_RDONLY, dir_fd=d)\n"
                                       f"assert {secret!r}.encode() in os.read(fd, 1 << 20)"),
        "read_any_environ": (f"import glob\nassert any({secret!r}.encode() in open(p, 'rb').read() "
                             f"for p in glob.glob('/proc/*/environ'))"),
        "read_dev_shm": f"assert open({shm + '-planted'!r}).read() == {secret!r}",
        "write_file": f"open({outside + '/w_open.txt'!r}, 'w').write('escaped')",
        "write_dir_fd_pth": (f"import os\nd = os.open({outside!r}, os.O_RDONLY)\n"
                             f"fd = os.open('evil.pth', os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=d)\n"
                             "os.write(fd, b'import os')"),
        "write_site_packages_pth": (f"import os\nd = os.open('/', os.O_RDONLY)\n"
                                    f"fd = os.open({(site + '/' + marker + '.pth').lstrip('/')!r}, "
                                    "os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=d)\nos.write(fd, b'import os')"),
        "write_sqlite": (f"import sqlite3\nsqlite3.connect({outside + '/db.sqlite'!r}).execute('create table t (x)')"),
        "write_symlink": (f"import os\nos.symlink({outside + '/w_link.txt'!r}, 'l2')\nopen('l2', 'w').write('x')"),
        "write_dev_shm": (f"import os\nd = os.open('/dev/shm', os.O_RDONLY)\n"
                          f"os.close(os.open({marker!r}, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=d))"),
        "write_disk_bomb": ("for i in range(20000):\n    open(f'f{i}', 'w').write('x' * 8192)"),  # 160 MB
        "tcp_connect": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)",
        "raw_socket_module": f"s = __import__('_socket').socket()\ns.settimeout(1)\ns.connect(('127.0.0.1', {port}))",
        "unix_socket": f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({unix_path!r})",
        "abstract_unix_socket": f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({abstract_name!r})",
        "signal_parent": f"import os, signal\nos.kill({trainer_pid}, signal.SIGUSR1)",
        "signal_everyone": "import os, signal\nos.kill(-1, signal.SIGUSR1)",
        "pidfd_signal": (f"import os, signal\nsignal.pidfd_send_signal(os.pidfd_open({trainer_pid}), signal.SIGUSR1)"),
        "ctypes_kill_parent": (f"import ctypes\nassert ctypes.CDLL(None).kill({trainer_pid}, 10) == 0"),
        "ctypes_crash": "import ctypes\nctypes.string_at(0)",
        "raise_limits": "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (-1, -1))",
        "fork_bomb": "import os\nwhile True:\n    os.fork()",
        "outliving_fork": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)",
        "outliving_subprocess": "import subprocess\nsubprocess.Popen(['sleep', '60'], start_new_session=True)",
        "threads": "import threading\nt = threading.Thread(target=lambda: None)\nt.start()\nt.join()",
        "memory_bomb": "hog = []\nwhile True:\n    hog.append(bytearray(50 * 2**20))",
        "infinite_loop": "while True:\n    pass",
        "sleep_forever": "import time\ntime.sleep(3600)",
        "huge_output": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)",
    }
    return {**gaming, **{name: f"{GOOD}\n{code}\n" for name, code in harm.items()}}


def _leftover_processes(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def run_suite(audit_hook: bool = True) -> dict:
    """Run every hostile program and the correct one in one batch; returns rewards and what escaped."""
    from rlplane.envs.code import CodeEnv

    marker = f"rlplane-hostile-{uuid.uuid4().hex[:8]}"
    secret = f"s3cret-{uuid.uuid4().hex}"
    tmp = tempfile.mkdtemp(prefix=f"{marker}-tmp-")  # every sandbox process's argv names it
    os.chmod(tmp, 0o711)  # as for the default temporary directory: another uid may pass through
    outside = tempfile.mkdtemp(prefix=f"{marker}-outside-")
    os.chmod(outside, 0o777)  # writable by any uid: only the sandbox stands between a program and it
    with open(f"{outside}/secret.txt", "w") as f:
        f.write(secret)
    os.chmod(f"{outside}/secret.txt", 0o644)
    shm = f"/dev/shm/{marker}"
    with open(shm + "-planted", "w") as f:
        f.write(secret)
    os.chmod(shm + "-planted", 0o644)
    shm_before = set(os.listdir("/dev/shm"))
    signals = []
    old_handler = signal.signal(signal.SIGUSR1, lambda *_: signals.append(1))
    tcp = socket.create_server(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(f"{outside}/sock")
    os.chmod(f"{outside}/sock", 0o777)
    unix.listen()
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0{marker}")
    abstract.listen()
    listeners = (tcp, unix, abstract)
    for s in listeners:
        s.setblocking(False)
    programs = hostile_programs(outside, marker, secret, os.getpid(), tcp.getsockname()[1], f"{outside}/sock",
                                f"\0{marker}")
    os.environ[SECRET_ENV] = secret  # the trainer's secret no program may see
    old_tempdir, tempfile.tempdir = tempfile.tempdir, tmp
    try:
        env = CodeEnv(cpu_seconds=1, wall_seconds=2, memory_mb=256, output_kb=16, num_workers=2)
        env.limits = dataclasses.replace(env.limits, audit_hook=audit_hook)
        names = [*programs, "good"]
        logs = [[{"role": "assistant", "content": f"```python\n{programs[n]}```"}] for n in programs]
        logs.append([{"role": "assistant", "content": f"```python\n{GOOD}```"}])
        ret = env.step(logs, [{"tests": TESTS}] * len(logs))
    finally:
        tempfile.tempdir = old_tempdir
        del os.environ[SECRET_ENV]
    escapes = []
    for name in ("w_open.txt", "evil.pth", "db.sqlite", "w_link.txt"):
        if os.path.exists(f"{outside}/{name}"):
            escapes.append(f"{outside}/{name} was created")
    site_pth = f"{sysconfig.get_paths()['purelib']}/{marker}.pth"
    if os.path.exists(site_pth):
        escapes.append(f"{site_pth} was created")
        os.remove(site_pth)
    new_shm = sorted(e for e in set(os.listdir("/dev/shm")) - shm_before if marker in e)
    escapes += [f"/dev/shm/{e} was created" for e in new_shm]
    leftover = _leftover_processes(marker)
    escapes += [f"process {pid} outlived its run" for pid in leftover]
    for s in listeners:
        try:
            s.accept()
            escapes.append(f"a program connected to {s.getsockname()!r}")
        except BlockingIOError:
            pass
        s.close()
    escapes += [f"the trainer received SIGUSR1 ({len(signals)}x)"] if signals else []
    signal.signal(signal.SIGUSR1, old_handler)
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    for path in os.listdir("/dev/shm"):
        if marker in path:
            os.remove(f"/dev/shm/{path}")
    import shutil

    shutil.rmtree(outside, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)
    return {"uid": os.geteuid(), "isolation": env.isolation, "rewards": dict(zip(names, ret.rewards.tolist())),
            "observations": dict(zip(names, (o["content"] for o in ret.observations))), "escapes": escapes}


if __name__ == "__main__":
    print(json.dumps({"with_hook": run_suite(audit_hook=True), "without_hook": run_suite(audit_hook=False)}))
    sys.stdout.flush()
