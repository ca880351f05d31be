"""Calls that used to hang with nothing printed end in one line: a reward function that blocks in the
start-up check, a Ray cluster address with nothing behind it, an MLflow server that is not there. And user
code that exits (or raises KeyboardInterrupt) inside the async collector's thread or child process is the
user's failure in one line, as on the synchronous path.

Each run goes through ``main`` in a helper thread joined with a generous bound: on the old code these
calls never returned, and a test must fail rather than hang the suite."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from rlplane.cli import main
from rlplane.errors import ConfigError
from tests.tiny import TINY_RUN

TINY = [*TINY_RUN, "grpo.max_num_steps=3", "grpo.val_at_end=false", "checkpointing.enabled=false",
        "logger.progress_bar=false"]
ASYNC = ["grpo.async_grpo.enabled=true", "loss_fn.use_importance_sampling_correction=true"]
BOUND_S = 180  # far beyond a passing run; only a hang reaches it

USER_MODULE = textwrap.dedent('''
    import sys
    import threading

    RELEASE = threading.Event()
    CALLS = [0]

    def blocks(prompt, completion, extra):
        RELEASE.wait()
        return 1.0

    def _later(error):
        CALLS[0] += 1
        if CALLS[0] > 1:  # the start-up check's call passes: the collector's calls exit
            raise error
        return 0.0

    def exits_later(prompt, completion, extra):
        return _later(SystemExit(5))

    def interrupts_later(prompt, completion, extra):
        return _later(KeyboardInterrupt())
''')


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    name = f"hang_code_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    module = sys.modules.pop(name, None)
    if module is not None:
        module.RELEASE.set()  # free a left-behind call


def run_bounded(argv: list[str], capsys) -> tuple[int | None, list[str]]:
    """``main(argv)`` in a thread: (exit status or None if it is still running after BOUND_S, stderr lines)."""
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("rc", main(argv)), daemon=True)
    thread.start()
    thread.join(BOUND_S)
    return box.get("rc"), capsys.readouterr().err.strip().splitlines()


def test_a_blocking_reward_function_fails_the_start_up_check_in_one_line(user_module, tmp_path, capsys):
    """The start-up check called it with no deadline: the run hung before its first step, silently."""
    rc, err = run_bounded(["train", "--quiet", *TINY, f"run_dir={tmp_path / 'r'}", "env.step_timeout_s=1",
                           f"env.arithmetic.reward_fn={user_module}:blocks"], capsys)
    assert rc == 2, err
    assert err == [f"rlplane: error: start-up check: env.arithmetic.reward_fn = '{user_module}:blocks' on row 0 did "
                   "not return within 1 s (env.step_timeout_s = 1); raise env.step_timeout_s if it needs longer, or "
                   "find why it hangs; the run stops (a hung call cannot be interrupted)"]


@pytest.mark.parametrize("process", [False, True], ids=["thread", "child-process"])
@pytest.mark.parametrize("fn, did", [("exits_later", "called sys.exit(5)"),
                                     ("interrupts_later", "raised KeyboardInterrupt")])
def test_user_code_exiting_in_the_async_collector_is_the_users_failure(user_module, tmp_path, capsys, fn, did,
                                                                        process):
    """The collector's thread died silently (a thread swallows SystemExit) and the trainer waited for
    its groups forever."""
    rc, err = run_bounded(["train", "--quiet", *TINY, *ASYNC, f"run_dir={tmp_path / 'r'}",
                           f"grpo.async_grpo.collector_process={str(process).lower()}",
                           f"env.arithmetic.reward_fn={user_module}:{fn}"], capsys)
    assert rc == 2, err
    errors = [ln for ln in err if ln.startswith("rlplane: error:")]
    assert len(errors) == 1 and "Traceback" not in "\n".join(err), err
    assert errors[0].startswith(f"rlplane: error: async collector stopped: {user_module}._later (")
    assert f"{did} during the run" in errors[0] and errors[0].endswith("the run stopped as failed")


def test_an_mlflow_server_that_is_not_there_fails_in_one_line(tmp_path, capsys):
    """MLflow's client retried a refused server for minutes before its own multi-line error. Failing (rather
    than warning and training on) is the choice: the user asked for the metrics there, and nothing slow ran yet."""
    pytest.importorskip("mlflow")
    rc, err = run_bounded(["train", "--quiet", *TINY, f"run_dir={tmp_path / 'r'}", "logger.mlflow_enabled=true",
                           "logger.mlflow.tracking_uri=http://127.0.0.1:1"], capsys)
    assert rc == 2, err
    assert err == ["rlplane: error: logger.mlflow.tracking_uri = 'http://127.0.0.1:1': cannot connect to 127.0.0.1:1 "
                   "(Connection refused); start the tracking server or fix the URI (unset: a sqlite store in the log "
                   "directory)"]


def test_a_cluster_address_with_nothing_behind_it_fails_in_one_line(tmp_path):
    """ray.init(address=...) retried a closed GCS port forever. A process of its own: Ray is not started yet."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-m", "rlplane.cli", "train", "--quiet", *TINY, f"run_dir={tmp_path / 'r'}",
                           "runtime=ray", "data_plane.backend=ray", "cluster.address=127.0.0.1:1"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=BOUND_S)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "rlplane: error: cluster.address = '127.0.0.1:1': cannot connect to 127.0.0.1:1 (Connection refused); start "
        "the cluster (ray start --head) or fix the address; null runs a local Ray"]


@pytest.mark.parametrize("address, default, expected", [
    ("10.0.0.5:6379", 6379, ("10.0.0.5", 6379)), ("head", 6379, ("head", 6379)),
    ("ray://head:10001", 10001, ("head", 10001)), ("ray://head", 10001, ("head", 10001)),
    ("[::1]:6380", 6379, ("::1", 6380)), ("https://mlflow.example/x", 443, ("mlflow.example", 443)),
])
def test_addresses_are_read_as_host_and_port(address, default, expected):
    from rlplane.utils.reachable import host_port

    assert host_port(address, default) == expected


@pytest.mark.parametrize("address", ["head:port", ":6379"])
def test_a_malformed_address_is_one_line(address):
    from rlplane.utils.reachable import check_server

    with pytest.raises(ConfigError, match=rf"^cluster.address = '{address}': not a host:port address"):
        check_server(address, 6379, "cluster.address", "fix it", protocol="grpc", timeout_s=5,
                     timeout_key="cluster.connect_timeout_s")


def test_a_ray_cluster_that_refuses_the_connection_is_one_line(monkeypatch):
    """A reachable address whose Ray refuses the driver (here: token authentication) is one line, not Ray's trace."""
    import ray

    from rlplane.runtime import groups

    def refuse(**kwargs):
        try:
            raise RuntimeError("Failed to connect to GCS.\nAuthenticationError: InvalidAuthToken: token missing")
        except RuntimeError as e:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.5:6379") from e

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setattr(groups, "check_server", lambda *a, **k: None)
    with pytest.raises(ConfigError) as e:
        groups.init_ray(address="10.0.0.5:6379")
    assert str(e.value) == (
        "cluster.address = '10.0.0.5:6379': Ray did not accept the connection (Failed to connect to GCS. "
        "AuthenticationError: InvalidAuthToken: token missing); check the address, and for a cluster with token "
        "authentication set RAY_AUTH_TOKEN")
