"""The code sandbox against hostile programs: each is contained, scored as a failure, and the batch goes on.

All hostile programs run in one ``CodeEnv.step`` batch with a correct solution last: the batch must
finish, every hostile sample must score 0, the correct one 1, and nothing may be left behind
(files outside the work directory, processes).
"""

from __future__ import annotations

import os
import textwrap
import uuid

import pytest

from rlplane.envs import create_env
from rlplane.envs.code import CodeEnv, extract_code
from rlplane.envs.sandbox import SandboxLimits, run_python

MARKER = f"rlplane-escape-{uuid.uuid4().hex[:8]}"
ESCAPE_FILE = f"/tmp/{MARKER}.txt"
SECRET = f"s3cret-{uuid.uuid4().hex[:8]}"
TESTS = "assert add(2, 3) == 5\n"

# Each program defines a correct `add` (so only the hostile part can make it fail) and then does harm.
HOSTILE = {
    "read_outside": "print(open('/etc/passwd').read())",
    "read_outside_relative": "import os\nprint(open(os.path.join('..', '..', '..', 'etc', 'hostname')).read())",
    "write_outside": f"open({ESCAPE_FILE!r}, 'w').write('escaped')",
    "socket": "import socket\ns = socket.create_connection(('1.1.1.1', 53), timeout=1)",
    "raw_socket_module": "_s = __import__('_socket')\n_s.socket().connect(('127.0.0.1', 22))",
    "fork_bomb": "import os\nwhile True:\n    os.fork()",
    "memory_bomb": "hog = []\nwhile True:\n    hog.append(bytearray(50 * 2**20))",
    "infinite_loop": "while True:\n    pass",
    "sleep_forever": "import time\ntime.sleep(3600)",
    "huge_output": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)",
    "parent_env": (
        f"import os\nassert {SECRET!r} not in repr(dict(os.environ))\n"
        f"data = open('/proc/%d/environ' % os.getppid(), 'rb').read()\nassert {SECRET!r}.encode() not in data"
    ),
    "outliving_process": (
        f"import subprocess\nsubprocess.Popen(['sleep', '30', {MARKER!r}], start_new_session=True)"
    ),
    "outliving_fork": (
        "import os, time\n"
        "if os.fork() == 0:\n    os.setsid()\n    time.sleep(30)\n"
    ),
    "ctypes_crash": "import ctypes\nctypes.string_at(0)",
    "kill_parent": "import os\nos.kill(os.getppid(), 15)",
    "raise_limits": "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (-1, -1))\nwhile True:\n    pass",
}
GOOD = "def add(a, b):\n    return a + b\n"


def _program(harm: str) -> str:
    return f"```python\n{GOOD}\n{harm}\n```"


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


@pytest.fixture(scope="module")
def hostile_results():
    os.environ["RLPLANE_TEST_SECRET"] = SECRET  # the parent's secret the program must not see
    try:
        env = CodeEnv(cpu_seconds=1, wall_seconds=2, memory_mb=256, output_kb=16, num_workers=2)
        names = [*HOSTILE, "good"]
        logs = [[{"role": "assistant", "content": _program(HOSTILE[n])}] for n in HOSTILE]
        logs.append([{"role": "assistant", "content": _program("")}])
        ret = env.step(logs, [{"tests": TESTS}] * len(logs))
        return dict(zip(names, ret.rewards.tolist())), ret
    finally:
        del os.environ["RLPLANE_TEST_SECRET"]


def test_there_are_at_least_ten_hostile_programs():
    assert len(HOSTILE) >= 10


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_program_is_scored_as_failure(hostile_results, name):
    rewards, _ = hostile_results
    assert rewards[name] == 0.0, f"{name} passed: it was not contained"


def test_the_batch_goes_on_after_hostile_programs(hostile_results):
    rewards, ret = hostile_results
    assert rewards["good"] == 1.0
    assert ret.observations[-1]["content"] == "passed"
    assert bool(ret.terminateds.all())


def test_nothing_escapes_or_outlives_the_run(hostile_results):
    assert not os.path.exists(ESCAPE_FILE)
    assert _leftover_processes(MARKER) == []


def test_failures_say_why():
    limits = SandboxLimits(cpu_seconds=1, wall_seconds=2)
    loop = run_python("while True:\n    pass", limits)
    assert loop.killed_by == "SIGXCPU" and not loop.ok
    sleep = run_python("import time\ntime.sleep(60)", limits)
    assert sleep.timed_out and not sleep.ok and sleep.wall_seconds < 10
    blocked = run_python("open('/etc/passwd')", limits)
    assert "sandbox: reading '/etc/passwd' is not allowed" in blocked.stderr


def test_a_program_may_use_its_own_directory_and_the_preloaded_modules():
    r = run_python("import json, math\nopen('out.txt', 'w').write(json.dumps(math.factorial(5)))\n"
                   "print(open('out.txt').read())")
    assert r.ok and r.stdout.strip() == "120"


def test_environment_is_scrubbed():
    r = run_python("import os\nprint(sorted(os.environ))")
    assert r.ok
    assert "RLPLANE" not in r.stdout and "PYTHONPATH" not in r.stdout


def test_code_env_is_registered_and_extracts_the_last_block():
    env = create_env("code")
    assert isinstance(env, CodeEnv)
    assert extract_code("x\n```python\nA\n```\ntext\n```py\nB\n```") == "B\n"
    assert extract_code("print(1)") == "print(1)"


def test_code_env_multi_attempt_feedback():
    env = CodeEnv(max_attempts=2, num_workers=1)
    bad = [[{"role": "assistant", "content": "def add(a, b):\n    return a - b"}]]
    ret = env.step(bad, [{"tests": TESTS}])
    assert ret.rewards.tolist() == [0.0] and ret.terminateds.tolist() == [False]
    assert ret.observations[0]["content"] == "failed: AssertionError"
    ret = env.step(bad, ret.metadata)
    assert ret.terminateds.tolist() == [True]
    assert textwrap.dedent(ret.observations[0]["content"]).startswith("failed")


@pytest.mark.skipif(os.geteuid() != 0, reason="the network namespace and throwaway uid need root")
@pytest.mark.parametrize(
    "name, program",
    [
        ("fork", "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)"),  # RLIMIT_NPROC on its own uid
        ("connect", "import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect(('1.1.1.1', 53))"),  # empty network namespace
        ("parent_env", "import os\nopen('/proc/%d/environ' % os.getppid(), 'rb').read()"),  # another uid's file
        ("kill_parent", "import os\nos.kill(os.getppid(), 0)"),  # another uid's process
    ],
)
def test_os_layers_hold_without_the_audit_hook(name, program):
    r = run_python(program, SandboxLimits(audit_hook=False, preload_modules=("socket",)))
    assert not r.ok, f"{name}: {r.stdout} {r.stderr}"
    assert "sandbox:" not in r.stderr  # refused by the OS, not by the hook
    assert any(e in r.stderr for e in ("BlockingIOError", "PermissionError", "OSError: [Errno 101]")), r.stderr
    assert r.isolation == {"network_namespace": True, "own_uid": True}


def test_code_env_reads_tests_from_the_ground_truth_of_jsonl_rows():
    env = CodeEnv(num_workers=1)
    good = [[{"role": "assistant", "content": GOOD}]]
    assert env.step(good, [{"ground_truth": TESTS}]).rewards.tolist() == [1.0]
    with pytest.raises(ValueError, match="code sample without tests"):
        env.step(good, [{}])
