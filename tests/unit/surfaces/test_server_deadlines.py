"""A server that accepts the connection and never answers, at every start-up handshake: the Ray head
(``cluster.address``, ``RAY_ADDRESS``, a ``ray://`` client address), an MLflow server (HTTP and HTTPS), wandb's
server, the Hugging Face hub, and an environment actor whose constructor waits on a judge server. Each ends in
one line naming the address and the key to change, after its deadline: before, each held the run with nothing
printed (Ray and wandb without end, MLflow for minutes of retries).

The CLI cases run in one interpreter of their own (Ray must not be running in it: a started Ray skips the
handshake), one after the other; the silent server is a thread of this test process. No timing is asserted:
the script reports each case's seconds, and the deadlines are set low so that a hang shows as one.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

from rlplane.errors import ConfigError
from rlplane.utils.reachable import check_server
from tests.tiny import TINY_RUN

TINY = [*TINY_RUN, "grpo.max_num_steps=1", "grpo.val_at_end=false", "checkpointing.enabled=false",
        "logger.progress_bar=false"]
RAY = ["runtime=ray", "data_plane.backend=ray"]
BOUND_S = 240  # the whole script; only a hang reaches it


class SilentServer:
    """Accepts every connection, reads nothing, says nothing, until closed."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            self.accepted += 1

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def silent():
    server = SilentServer()
    yield server
    server.close()


SCRIPT = """
import contextlib, io, json, os, sys, time
from rlplane.cli import main

out = []
for case in json.loads(sys.argv[1]):
    saved = {k: os.environ.get(k) for k in case["env"]}
    os.environ.update(case["env"])
    err = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(case["argv"])
        except SystemExit as e:
            rc = e.code
    out.append({"id": case["id"], "rc": rc, "seconds": round(time.perf_counter() - t0, 2),
                "lines": err.getvalue().strip().splitlines()})
    for k, v in saved.items():
        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
print(json.dumps(out))
"""


def _cases(port: int, tmp) -> list[dict]:
    addr = f"127.0.0.1:{port}"
    run = ["train", "--quiet", *TINY]
    return [
        {"id": "ray-head", "env": {}, "argv": [*run, f"run_dir={tmp}/a", *RAY, f"cluster.address={addr}",
                                               "cluster.connect_timeout_s=2"]},
        {"id": "ray-address-env", "env": {"RAY_ADDRESS": addr}, "argv": [*run, f"run_dir={tmp}/b", *RAY,
                                                                         "cluster.connect_timeout_s=2"]},
        {"id": "ray-client", "env": {}, "argv": [*run, f"run_dir={tmp}/c", *RAY, f"cluster.address=ray://{addr}",
                                                 "cluster.connect_timeout_s=2"]},
        {"id": "mlflow-http", "env": {}, "argv": [*run, f"run_dir={tmp}/d", "logger.mlflow_enabled=true",
                                                  f"logger.mlflow.tracking_uri=http://{addr}",
                                                  "logger.connect_timeout_s=2"]},
        {"id": "mlflow-https", "env": {}, "argv": [*run, f"run_dir={tmp}/e", "logger.mlflow_enabled=true",
                                                   f"logger.mlflow.tracking_uri=https://{addr}/mlflow",
                                                   "logger.connect_timeout_s=2"]},
        {"id": "wandb", "env": {"WANDB_BASE_URL": f"http://{addr}", "WANDB_API_KEY": "x" * 40, "WANDB_MODE": "online"},
         "argv": [*run, f"run_dir={tmp}/f", "logger.wandb_enabled=true", "logger.connect_timeout_s=2"]},
        {"id": "hf-hub", "env": {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": f"http://{addr}"},
         "argv": [*run, f"run_dir={tmp}/g", "policy.model_name=someorg/somemodel"]},
    ]


EXPECTED = {  # id -> the line's start after "rlplane: error: ", and what it must also say
    "ray-head": ("cluster.address = '{a}': 127.0.0.1:{p} accepted the connection but did not answer within 2 s "
                 "(cluster.connect_timeout_s = 2; raise it for a slow link)", "ray start --head"),
    "ray-address-env": ("RAY_ADDRESS = '{a}': 127.0.0.1:{p} accepted the connection but did not answer within 2 s "
                        "(cluster.connect_timeout_s = 2", "unset it to run a local Ray"),
    "ray-client": ("cluster.address = 'ray://{a}': 127.0.0.1:{p} accepted the connection but did not answer within "
                   "2 s", "cluster.connect_timeout_s"),
    "mlflow-http": ("logger.mlflow.tracking_uri = 'http://{a}': 127.0.0.1:{p} accepted the connection but did not "
                    "answer within 2 s (logger.connect_timeout_s = 2", "start the tracking server"),
    "mlflow-https": ("logger.mlflow.tracking_uri = 'https://{a}/mlflow': 127.0.0.1:{p} accepted the connection but "
                     "did not answer within 2 s", "logger.connect_timeout_s"),
    "wandb": ("WANDB_BASE_URL = 'http://{a}': 127.0.0.1:{p} accepted the connection but did not answer within 2 s "
              "(logger.connect_timeout_s = 2", "WANDB_MODE=offline"),
    "hf-hub": ("model_name='someorg/somemodel': a hub id that is not in the local Hugging Face cache, and the hub "
               "(HF_ENDPOINT = http://{a}) did not answer within 3 s", "local Hugging Face model directory"),
}


def test_every_start_up_handshake_with_a_silent_server_ends_in_one_line(silent, tmp_path):
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    cases = _cases(silent.port, tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(cases)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=BOUND_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {r["id"]: r for r in json.loads(proc.stdout)}
    print("\n" + "\n".join(f"{i}: {r['seconds']} s: {r['lines'][-1:]}" for i, r in results.items()))
    addr = f"127.0.0.1:{silent.port}"
    for cid, (start, also) in EXPECTED.items():
        r = results[cid]
        errors = [ln for ln in r["lines"] if ln.startswith("rlplane: error:")]
        assert r["rc"] == 2 and len(errors) == 1 and "Traceback" not in "\n".join(r["lines"]), (cid, r)
        line = errors[0].removeprefix("rlplane: error: ")
        assert line.startswith(start.format(a=addr, p=silent.port)) and also in line, (cid, line)
    assert silent.accepted >= len(EXPECTED), "the cases did reach the server"


def test_a_gcs_that_answers_passes_the_handshake():
    """A server that answers gRPC's opening (here: any byte back) is let through to the client."""
    server = socket.create_server(("127.0.0.1", 0))

    def answer():
        conn, _ = server.accept()
        conn.recv(64)
        conn.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # an empty SETTINGS frame
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    check_server(f"127.0.0.1:{server.getsockname()[1]}", 6379, "cluster.address", "fix it", protocol="grpc",
                 timeout_s=5, timeout_key="cluster.connect_timeout_s")
    server.close()


def test_a_refused_connection_names_the_address_at_once():
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    with pytest.raises(ConfigError, match=rf"^cluster.address = '127.0.0.1:{port}': cannot connect to "
                                          rf"127.0.0.1:{port} \(Connection refused\); fix it$"):
        check_server(f"127.0.0.1:{port}", 6379, "cluster.address", "fix it", protocol="grpc", timeout_s=5,
                     timeout_key="cluster.connect_timeout_s")


JUDGE_ENV = textwrap.dedent('''
    import socket

    import ray
    import torch

    from rlplane.envs import EnvironmentReturn

    class JudgeEnv:
        """In a Ray actor, connects to its judge server in the constructor and waits for a greeting that never
        comes (the driver's own start-up check builds it where the judge is not needed)."""

        def __init__(self):
            if ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
                self.conn = socket.create_connection(("127.0.0.1", JUDGE_PORT))
                self.conn.recv(1)

        def step(self, message_logs, metadata):
            n = len(message_logs)
            return EnvironmentReturn(observations=[{"role": "environment", "content": ""}] * n, metadata=metadata,
                                     next_stop_strings=[None] * n, rewards=torch.zeros(n),
                                     terminateds=torch.ones(n, dtype=torch.bool), answers=[None] * n)
''')


@pytest.mark.ray
def test_an_environment_actor_waiting_on_a_silent_judge_ends_in_one_line(silent, tmp_path, monkeypatch,
                                                                           ray_session, capsys):
    from rlplane.cli import main

    (tmp_path / "judge_env.py").write_text(f"JUDGE_PORT = {silent.port}\n{JUDGE_ENV}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    box: dict = {}
    argv = ["train", "--quiet", *TINY, *RAY, f"run_dir={tmp_path / 'r'}", "data.arithmetic.task_name=judge",
            "env.judge.class=judge_env:JudgeEnv", "env.start_timeout_s=3"]
    thread = threading.Thread(target=lambda: box.setdefault("rc", main(argv)), daemon=True)
    thread.start()
    thread.join(BOUND_S)
    err = capsys.readouterr().err.strip().splitlines()
    assert box.get("rc") == 2, err
    errors = [ln for ln in err if ln.startswith("rlplane: error:")]
    assert errors == ["rlplane: error: environment actors 'judge' #0 (1 of 1) did not start within 3 s "
                      "(env.start_timeout_s = 3): a constructor that waits on a server, or a Ray cluster with no "
                      "room for them; raise env.start_timeout_s, free the cluster or lower env.actors_per_env"], err
