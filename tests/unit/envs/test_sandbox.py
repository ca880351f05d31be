"""The code sandbox against hostile programs, as root and as an unprivileged user.

The hostile programs (``hostile_programs.py``) run in one ``CodeEnv`` batch with a correct solution
last: every hostile one must score 0, the correct one 1, and nothing may be left behind. The batch
runs twice, with the audit hook and without it (the OS isolation alone). When the tests run as root,
the same script runs again under a fresh unprivileged uid (the trainer-is-not-root case).
"""

from __future__ import annotations

import importlib.util
import json
import os
import textwrap
from pathlib import Path

import pytest

from rlplane.envs import UnknownEnvironmentError, create_env, sandbox
from rlplane.envs.code import CodeEnv, extract_code
from rlplane.envs.sandbox import SandboxLimits, SandboxUnavailable, run_python

_HOSTILE = Path(__file__).with_name("hostile_programs.py")
_spec = importlib.util.spec_from_file_location("hostile_programs", _HOSTILE)
hostile = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hostile)
GOOD, TESTS = hostile.GOOD, hostile.TESTS
_spec = importlib.util.spec_from_file_location("unprivileged", Path(__file__).parents[1] / "unprivileged.py")
unprivileged = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(unprivileged)


def _report(suite: dict) -> tuple[int, int]:
    """(contained, total) hostile programs: contained = scored 0 (nothing escaped is checked separately)."""
    hostile_rewards = {n: r for n, r in suite["rewards"].items() if n != "good"}
    return sum(r == 0.0 for r in hostile_rewards.values()), len(hostile_rewards)


def _check_suite(suite: dict, who: str) -> None:
    contained, total = _report(suite)
    print(f"{who}: {contained}/{total} hostile programs contained ({suite['isolation']}, uid {suite['uid']})")
    assert total >= 25
    passed = [n for n, r in suite["rewards"].items() if n != "good" and r != 0.0]
    assert passed == [], f"{who}: not contained: {[(n, suite['observations'][n]) for n in passed]}"
    assert suite["escapes"] == [], f"{who}: {suite['escapes']}"
    assert suite["rewards"]["good"] == 1.0 and suite["observations"]["good"] == "passed"


@pytest.fixture(scope="module")
def suite_here():
    return {"with_hook": hostile.run_suite(audit_hook=True), "without_hook": hostile.run_suite(audit_hook=False)}


@pytest.mark.parametrize("layer", ["with_hook", "without_hook"])
def test_hostile_programs_are_contained(suite_here, layer):
    _check_suite(suite_here[layer], f"uid {os.geteuid()}, {layer}")


@pytest.fixture(scope="module")
def unprivileged_user():
    if os.geteuid() != 0:
        pytest.skip("the tests already run unprivileged: test_hostile_programs_are_contained covers that case")
    if (why := unprivileged.missing_reason()) is not None:
        pytest.skip(why)
    with unprivileged.system_user() as user:
        yield user


def test_hostile_programs_are_contained_for_an_unprivileged_trainer(unprivileged_user, tmp_path):
    """The same batch, run by a trainer process with an ordinary uid and no capabilities (``tests/unit/
    unprivileged.py``: a private mount namespace opens the way to an interpreter below /root)."""
    os.chmod(tmp_path, 0o755)
    run = unprivileged.run_python_as(unprivileged_user, [str(_HOSTILE)], hold=tmp_path / "hold",
                                     home=tmp_path / "home", needed=(str(_HOSTILE),))
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    for layer, suite in result.items():
        assert suite["uid"] == unprivileged_user.pw_uid and suite["isolation"] == "user namespace"
        _check_suite(suite, f"unprivileged uid {suite['uid']}, {layer}")


def test_failures_say_why():
    limits = SandboxLimits(cpu_seconds=1, wall_seconds=2)
    # A wide wall clock: on a loaded machine 1 s of CPU can take more than 2 s.
    loop = run_python("while True:\n    pass", SandboxLimits(cpu_seconds=1, wall_seconds=20))
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


@pytest.mark.parametrize(
    "name, program",
    [
        ("fork", "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)"),  # RLIMIT_NPROC
        ("connect", "import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect(('1.1.1.1', 53))"),  # empty netns
        ("host_file", "open('/etc/hostname').read()"),  # the host's filesystem is not in the new root
        ("write_root", "open('/x', 'w')"),  # the new root is read-only
        ("proc", "import os\nos.listdir('/proc')"),  # no /proc: no other process to read or name
    ],
)
def test_os_layers_hold_without_the_audit_hook(name, program):
    r = run_python(program, SandboxLimits(audit_hook=False, preload_modules=("socket",)))
    assert not r.ok, f"{name}: {r.stdout} {r.stderr}"
    assert "sandbox:" not in r.stderr  # refused by the OS, not by the hook
    assert any(e in r.stderr for e in ("BlockingIOError", "PermissionError", "OSError: [Errno",
                                        "FileNotFoundError")), r.stderr
    assert r.isolation["mechanism"] == ("namespaces (root)" if os.geteuid() == 0 else "user namespace")


def test_exiting_early_never_passes():
    # Item 10: before, `raise SystemExit(0)` or `os._exit(0)` ahead of the appended tests scored 1.0.
    env = CodeEnv(num_workers=2)
    gaming = ["raise SystemExit(0)", "import sys\nsys.exit(0)", "import os\nos._exit(0)",
              f"{GOOD}\nimport os\nos._exit(0)", f"{GOOD}\nraise SystemExit(0)"]
    logs = [[{"role": "assistant", "content": c}] for c in gaming]
    ret = env.step(logs, [{"tests": TESTS}] * len(logs))
    assert ret.rewards.tolist() == [0.0] * len(gaming)
    assert ret.observations[0]["content"].startswith("failed: sandbox: solution.py raised SystemExit(0)")
    assert ret.observations[2]["content"] == "failed: exited before the tests finished"
    # A SystemExit in the tests fails too, and output before the nonce is the program's own.
    r = run_python("print('hi')", tests="raise SystemExit(0)")
    assert not r.ok and "tests.py raised SystemExit(0)" in r.stderr
    r = run_python("print('hi')", tests="assert True")
    assert r.ok and r.completed and r.stdout == "hi\n"


def test_code_env_refuses_to_start_without_isolation(monkeypatch):
    # Fail closed: a machine that cannot make the namespaces gives one line (what is missing, how to get it).
    def fail(*_a, **_k):
        raise sandbox._unavailable({"error": "unshare(CLONE_NEWUSER): unprivileged user namespaces failed: EPERM"}, "")

    monkeypatch.setattr("rlplane.envs.code.check_isolation", fail)
    with pytest.raises(UnknownEnvironmentError) as e:
        CodeEnv()
    message = str(e.value)
    assert "\n" not in message and "no OS isolation" in message and "EPERM" in message
    assert "user.max_user_namespaces" in message


def test_run_python_fails_closed_when_the_runner_cannot_isolate(monkeypatch, tmp_path):
    # The real runner, with a namespace flag the kernel rejects: it must refuse before the program runs.
    marker = tmp_path / "ran"
    runner = tmp_path / "runner.py"
    runner.write_text(sandbox._RUNNER.read_text().replace(
        "flags = _CLONE_NEWNET", "flags = 0x1 | _CLONE_NEWNET"))  # an invalid clone flag: EINVAL
    monkeypatch.setattr(sandbox, "_RUNNER", runner)
    with pytest.raises(SandboxUnavailable, match="no OS isolation on this machine .*EINVAL"):
        run_python(f"open({str(marker)!r}, 'w')", SandboxLimits(audit_hook=False))
    assert not marker.exists()


def test_code_env_reads_tests_from_the_ground_truth_of_jsonl_rows():
    env = CodeEnv(num_workers=1)
    good = [[{"role": "assistant", "content": GOOD}]]
    assert env.step(good, [{"ground_truth": TESTS}]).rewards.tolist() == [1.0]
    with pytest.raises(ValueError, match="code sample without tests"):
        env.step(good, [{}])
