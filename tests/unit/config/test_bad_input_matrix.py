"""A hostile-but-ordinary user's bad commands, run through the CLI in-process (and the Python API's).

Each case asserts: exit status 2, stderr is exactly one line starting ``rlplane: error:``, no
traceback, nothing the user had was changed or removed, and (for ``train``) no checkpoint was
written: the error came before training. ``test_matrix_counts`` prints the tally, in all and per
surface (the case id's first part): one-line errors / tracebacks / wrong behaviours (as JSON too, to
the file named by ``RLPLANE_MATRIX_JSON``). A few cases run the installed ``rlplane``
console script in a subprocess, to check the real entry point too.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import pty
import signal
import stat
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest

import rlplane
from rlplane.cli import main
from rlplane.runtime.process_actor import PARENT_POLL_S


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the later case modules import the first one's world and helpers
    spec.loader.exec_module(module)
    return module


C = _load("matrix_cases")
READERS, PARTS = _load("matrix_cases_readers"), _load("matrix_cases_parts")
CASES, T, TINY = C.CASES, C.T, C.TINY
EXPECTING_CASES = READERS.CASES + PARTS.CASES  # (id, argv, setup, "one-line" | "runs")
RESULTS: dict[str, str] = {}  # case id -> "one-line" | "ok" | "traceback" | "wrong: why"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = tmp_path_factory.mktemp("world")
    C.build_world(w)
    READERS.build_world(w)
    sys.path.insert(0, str(w))  # matrix_user importable, as from the working directory
    yield w
    sys.path.remove(str(w))
    sys.modules.pop("matrix_user", None)


# ---- running and judging a case ---------------------------------------------------------------------
def _snapshot(*roots: Path) -> dict[str, str]:
    """Each file's content hash (a large file's size and modification time; a FIFO or device: its kind)."""
    out = {}
    for root in roots:
        for dirpath, _, files in os.walk(root):
            for f in files:
                if f == ".rlplane.lock":  # rlplane's own: a run rewrites its holder's pid there
                    continue
                p = os.path.join(dirpath, f)
                st = os.stat(p)
                if not stat.S_ISREG(st.st_mode):  # opening a FIFO would wait for a writer
                    out[p] = f"mode {stat.S_IFMT(st.st_mode)}"
                elif st.st_size > 1 << 20:
                    out[p] = f"{st.st_size} bytes, mtime {st.st_mtime_ns}"
                else:
                    with open(p, "rb") as fh:
                        out[p] = hashlib.sha1(fh.read()).hexdigest()
    return out


def _judge(rc, err: str, escaped: str | None, before: dict, after: dict, argv: list[str],
           expect: str = "one-line") -> str:
    if escaped is not None or "Traceback" in err:
        return "traceback"
    lines = err.strip().splitlines()
    if expect == "runs":
        errors = [ln for ln in lines if ln.startswith("rlplane: error:")]
        if rc != 0 or errors:
            return f"wrong: expected a run, got exit status {rc}: {errors[:1] or lines[-1:]}"
        changed = [p for p, h in before.items() if after.get(p) != h]
        return f"wrong: changed or removed the user's {changed[:2]}" if changed else "ok"
    if rc != 2:
        return f"wrong: exit status {rc}"
    if len(lines) != 1 or not lines[0].startswith("rlplane: error:"):
        return f"wrong: stderr is {len(lines)} lines: {lines[:3]}"
    changed = [p for p, h in before.items() if after.get(p) != h]
    if changed:
        return f"wrong: changed or removed the user's {changed[:2]}"
    new_ckpts = [p for p in after if p not in before and "/checkpoints/step_" in p]
    if argv[:1] == ["train"] and new_ckpts:
        return f"wrong: trained before failing ({new_ckpts[0]})"
    return "one-line"


def run_case(argv_t: list[str], world: Path, t: Path, capsys, setup, expect: str = "one-line") -> tuple[str, str]:
    try:
        return _run_case(argv_t, world, t, capsys, setup, expect)
    finally:
        while C.MOUNTS:  # a full-disk case's tmpfs
            subprocess.run(["umount", "-l", C.MOUNTS.pop()], check=False)


def _run_case(argv_t: list[str], world: Path, t: Path, capsys, setup, expect: str) -> tuple[str, str]:
    if setup is not None:
        setup(world, t)
    argv = [a.replace("{w}", str(world)).replace("{t}", str(t)) for a in argv_t]
    before = _snapshot(world, t)
    capsys.readouterr()
    escaped, rc = None, None
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    except BaseException:  # noqa: BLE001 - the point is to see it
        escaped = traceback.format_exc()
    err = capsys.readouterr().err
    verdict = _judge(rc, err, escaped, before, _snapshot(world, t), argv, expect)
    return verdict, (escaped or err).strip()


@pytest.mark.parametrize("cid, argv, setup", CASES, ids=[c[0] for c in CASES])
def test_bad_command_is_one_line_error(cid, argv, setup, world, tmp_path, capsys):
    verdict, err = run_case(argv, world, tmp_path, capsys, setup)
    RESULTS[cid] = verdict
    assert verdict == "one-line", f"{cid}: {verdict}\n{err[-1500:]}"


@pytest.mark.parametrize("cid, argv, setup, expect", EXPECTING_CASES, ids=[c[0] for c in EXPECTING_CASES])
def test_command_is_one_line_error_or_a_correct_run(cid, argv, setup, expect, world, tmp_path, capsys):
    """Readers (NeMo files, limits, data.tasks, data files) and parts (pools, weight sync, watchdog, early stop,
    deadlines): a one-line error, or a run that does what it was asked, as the case expects."""
    verdict, err = run_case(argv, world, tmp_path, capsys, setup, expect)
    RESULTS[cid] = verdict
    assert verdict == ("ok" if expect == "runs" else "one-line"), f"{cid}: {verdict}\n{err[-1500:]}"


@pytest.mark.ray
def test_ray_actors_that_cannot_fit_fail_fast(world, tmp_path, capsys, ray_session):
    """policy.dp_size=8 asks Ray for 4.5 CPUs; the session's cluster has 2: an error, not a hang."""
    argv = ["train", *T, "runtime=ray", "data_plane.backend=ray", "policy.dp_size=8",
            "policy.train_global_batch_size=8",
            "grpo.num_prompts_per_step=4", "policy.train_micro_batch_size=1"]
    verdict, err = run_case(argv, world, tmp_path, capsys, None)
    RESULTS["ray/dp8-on-2-cpus"] = verdict
    assert verdict == "one-line" and "need 4.5 CPUs" in err, err[-1500:]


@pytest.mark.parametrize("cid, argv", [
    ("subprocess/config-betas", ["train", "policy.optimizer.betas=[0.9,1.5]"]),
    ("subprocess/dataset-not-utf8", ["eval", "--model", "embedded:tiny-llama", "--dataset", "{w}/latin1.csv"]),
    ("subprocess/usage", ["eval", "-k", "0", "--model", "embedded:tiny-llama"]),
])
def test_console_script_gives_the_same_one_line(cid, argv, world, tmp_path):
    """The installed entry point (warnings, logging and all): still exactly one line."""
    argv = [a.replace("{w}", str(world)) for a in argv]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-m", "rlplane.cli", *argv], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    lines = proc.stderr.strip().splitlines()
    ok = proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("rlplane: error:")
    RESULTS[cid] = "one-line" if ok else ("traceback" if "Traceback" in proc.stderr else f"wrong: {lines[:3]}")
    assert ok, proc.stderr[-1500:]



def _tiny_reward(prompt, completion, extra):
    return 1.0


def _exits(prompt, completion, extra):
    sys.exit(0)


API_CASES = [
    ("api/evaluate-num-problems-0", lambda w, t: rlplane.evaluate(model="embedded:tiny-llama", num_problems=0)),
    ("api/evaluate-num-problems-negative", lambda w, t: rlplane.evaluate(model="embedded:tiny-llama", num_problems=-5)),
    ("api/evaluate-k-0", lambda w, t: rlplane.evaluate(model="embedded:tiny-llama", k=0)),
    ("api/evaluate-batch-size-0", lambda w, t: rlplane.evaluate(model="embedded:tiny-llama", batch_size=0)),
    ("api/evaluate-num-problems-float", lambda w, t: rlplane.evaluate(model="embedded:tiny-llama", num_problems=1.5)),
    ("api/evaluate-checkpoint-and-model",
     lambda w, t: rlplane.evaluate(model="embedded:tiny-llama", checkpoint=str(w / "run"))),
    ("api/evaluate-checkpoint-missing", lambda w, t: rlplane.evaluate(checkpoint=str(t / "nope"))),
    ("api/train-unknown-key", lambda w, t: rlplane.train(overrides=[*TINY, f"run_dir={t}/r", "grpo.nope=1"])),
    ("api/train-reward-for-no-task", lambda w, t: rlplane.train(
        overrides=[*TINY, f"run_dir={t}/r"], reward_fns={"no_such_task": _tiny_reward}, quiet=True)),
    ("api/train-local-reward-for-no-task", lambda w, t: rlplane.train(
        overrides=[*TINY, f"run_dir={t}/r"], reward_fns={"no_such_task": lambda p, c, e: 1.0}, quiet=True)),
    ("api/train-reward-sys-exit", lambda w, t: rlplane.train(
        overrides=[*TINY, f"run_dir={t}/r"], reward_fns={"arithmetic": _exits}, quiet=True)),
    ("api/train-max-grad-norm-negative", lambda w, t: rlplane.train(
        overrides=[*TINY, f"run_dir={t}/r", "policy.max_grad_norm=-1"], quiet=True)),
]


ALL_API_CASES = [(cid, call, "one-line") for cid, call in API_CASES] + PARTS.API_CASES


@pytest.mark.parametrize("cid, call, expect", ALL_API_CASES, ids=[c[0] for c in ALL_API_CASES])
def test_python_api_mistake_is_one_line_exception(cid, call, expect, world, tmp_path):
    """The Python entry points: an rlplane error whose message is one line, raised before any training; or, for
    a right call, a run."""
    from rlplane.cli import _user_errors

    before = _snapshot(world, tmp_path)
    try:
        call(world, tmp_path)
        verdict = "ok" if expect == "runs" else "wrong: returned normally"
    except _user_errors() as e:
        lines = str(e).strip().splitlines()
        verdict = "one-line" if len(lines) == 1 else f"wrong: message is {len(lines)} lines"
    except BaseException:  # noqa: BLE001 - the point is to see it
        verdict = "traceback"
    after = _snapshot(world, tmp_path)
    if verdict == "one-line" and any(after.get(p) != h for p, h in before.items()):
        verdict = "wrong: changed the user's files"
    if verdict == "one-line" and any("/checkpoints/step_" in p for p in after if p not in before):
        verdict = "wrong: trained before failing"
    if expect == "runs" and verdict == "one-line":
        verdict = "wrong: expected a run, got an error"
    RESULTS[cid] = verdict
    assert verdict == ("ok" if expect == "runs" else "one-line"), f"{cid}: {verdict}"


# ---- environment variables and signals: the console script in a process of its own ---------------------
RUN1 = ["train", "--quiet", *TINY, "grpo.max_num_steps=1", "checkpointing.enabled=false", "run_dir={t}/r"]
LONG = ["train", "--quiet", *TINY, "grpo.max_num_steps=100000", "checkpointing.enabled=false", "run_dir={t}/r"]
# (id, environment changes, argv, what the right outcome is: "runs" (exit 0) or "one-line" (an rlplane error))
ENV_CASES = [
    ("env/pythonwarnings-error", {"PYTHONWARNINGS": "error"}, RUN1, "runs"),
    ("env/home-is-file", {"HOME": "{w}/afile"}, RUN1, "runs"),
    ("env/home-unwritable", {"HOME": "/proc/nope"}, RUN1, "runs"),
    ("env/home-unwritable-packaged-model", {"HOME": "/proc/nope"},
     [*RUN1, "policy.model_name=packaged:smollm2-135m-instruct"], "one-line"),
    ("env/tmpdir-missing", {"TMPDIR": "{t}/nope"}, RUN1, "runs"),
    ("env/tmpdir-is-file", {"TMPDIR": "{w}/afile"}, RUN1, "runs"),
    ("env/rlplane-fast-bad-value", {"RLPLANE_FAST": "disable"}, RUN1, "one-line"),
    ("env/rlplane-fast-off", {"RLPLANE_FAST": "0"}, RUN1, "runs"),
    ("env/rlplane-switch-bad-value", {"RLPLANE_FUSED_DECODE": "nope"}, ["show-config"], "one-line"),
    ("env/rlplane-kill-at-malformed", {"RLPLANE_TEST_KILL_AT": "train"}, RUN1, "one-line"),
    ("env/rlplane-cache-dir-is-file", {"RLPLANE_CACHE_DIR": "{w}/afile"},
     [*RUN1, "policy.model_name=packaged:smollm2-135m-instruct"], "one-line"),
    ("env/rlplane-import-path-garbage", {"RLPLANE_IMPORT_PATH": "/nonexistent::\x01"}, RUN1, "runs"),
    ("env/omp-threads-zero", {"OMP_NUM_THREADS": "0"}, RUN1, "runs"),
    ("env/omp-threads-garbage", {"OMP_NUM_THREADS": "many"}, RUN1, "runs"),
    ("env/omp-threads-negative", {"OMP_NUM_THREADS": "-2"}, RUN1, "runs"),
    ("env/cuda-visible-empty", {"CUDA_VISIBLE_DEVICES": ""}, RUN1, "runs"),
    ("env/cuda-visible-minus-one", {"CUDA_VISIBLE_DEVICES": "-1"}, RUN1, "runs"),
    ("env/cuda-visible-garbage", {"CUDA_VISIBLE_DEVICES": "gpu0"}, RUN1, "runs"),
    ("env/cuda-visible-duplicate", {"CUDA_VISIBLE_DEVICES": "0,0"}, RUN1, "runs"),
    ("env/ray-address-dead", {"RAY_ADDRESS": "127.0.0.1:1"}, [*RUN1, "runtime=ray", "data_plane.backend=ray"],
     "one-line"),
    ("env/pythonioencoding-ascii", {"PYTHONIOENCODING": "ascii"}, ["show-config", "run_dir=caf\u00e9"], "runs"),
    ("env/locale-c", {"LC_ALL": "C", "LANG": "C"}, ["show-config", "run_dir=caf\u00e9"], "runs"),
]


def _console(argv: list[str], env: dict[str, str], cwd: Path, **kw) -> subprocess.Popen:
    full = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **env}
    return subprocess.Popen([sys.executable, "-m", "rlplane.cli", *argv], env=full, cwd=cwd, text=True,
                            stderr=subprocess.PIPE, start_new_session=True, **kw)


def _fill(items, world: Path, t: Path):
    return [a.replace("{w}", str(world)).replace("{t}", str(t)) for a in items]


@pytest.mark.parametrize("cid, env, argv, expect", ENV_CASES, ids=[c[0] for c in ENV_CASES])
def test_environment_variable_is_taken_or_one_line(cid, env, argv, expect, world, tmp_path):
    env = dict(zip(env, _fill(env.values(), world, tmp_path)))
    proc = _console(_fill(argv, world, tmp_path), env, tmp_path, stdout=subprocess.DEVNULL)
    _, err = proc.communicate(timeout=300)
    lines = err.strip().splitlines()
    if "Traceback" in err:
        verdict = "traceback"
    elif expect == "runs":
        verdict = "ok" if proc.returncode == 0 else f"wrong: exit status {proc.returncode}: {lines[-1:]}"
    else:
        ok = proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("rlplane: error:")
        verdict = "one-line" if ok else f"wrong: exit status {proc.returncode}, stderr {lines[:3]}"
    RESULTS[cid] = verdict
    assert verdict in ("ok", "one-line"), f"{cid}: {verdict}\n{err[-1500:]}"


BATCH_SCRIPT = """
import contextlib, io, json, os, sys
from rlplane.cli import main

out = {}
for cid, argv, env in json.loads(sys.argv[1]):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
        except BaseException as e:
            rc, err = None, io.StringIO("Traceback: " + repr(e))
    out[cid] = [rc, err.getvalue()]
    for k, v in saved.items():
        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
print(json.dumps(out))
"""
SERVER_IDS = [c[0] for c in PARTS.server_cases(0)]


def test_start_up_handshakes_with_a_silent_server_are_one_line(world, tmp_path):
    """Every handshake against a server that accepts and never answers, in one interpreter of its own (Ray not
    started there: a started Ray skips the handshake)."""
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    server = PARTS.SilentServer()
    try:
        cases = [(cid, _fill(argv, world, tmp_path), env) for cid, argv, env in PARTS.server_cases(server.port)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        env.pop("RAY_ADDRESS", None)
        proc = subprocess.run([sys.executable, "-c", BATCH_SCRIPT, json.dumps(cases)], capture_output=True, text=True,
                              env=env, cwd=tmp_path, timeout=300)
    finally:
        server.close()
    assert proc.returncode == 0, proc.stderr[-2000:]
    for cid, (rc, err) in json.loads(proc.stdout).items():
        lines = err.strip().splitlines()
        if "Traceback" in err:
            RESULTS[cid] = "traceback"
        elif rc == 2 and len(lines) == 1 and lines[0].startswith("rlplane: error:") and "did not answer" in lines[0]:
            RESULTS[cid] = "one-line"
        else:
            RESULTS[cid] = f"wrong: exit status {rc}, stderr {lines[:2]}"
    bad = {cid: RESULTS[cid] for cid in SERVER_IDS if RESULTS[cid] != "one-line"}
    assert not bad, bad


def _wait_for_a_step(run: Path, proc: subprocess.Popen) -> None:
    metrics = run / "logs" / "metrics.jsonl"
    for _ in range(1200):  # a generous bound on start-up: only a broken start reaches it
        if metrics.is_file() and metrics.read_text().count("\n") >= 1 or proc.poll() is not None:
            return
        time.sleep(0.25)


def _group_left(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


SIGNAL_CASES = [("signal/sigint-mid-run", "SIGINT"), ("signal/sigterm-mid-run", "SIGTERM"),
                ("signal/sighup-mid-run", "SIGHUP")]


@pytest.mark.parametrize("cid, name", SIGNAL_CASES, ids=[c[0] for c in SIGNAL_CASES])
def test_a_signal_mid_run_stops_it_cleanly(cid, name, world, tmp_path):
    """SIGINT, SIGTERM and SIGHUP stop after the step in progress with one line (exit 128 + the signal),
    leave no process behind, the run directory unlocked and no traceback."""
    proc = _console(_fill(LONG, world, tmp_path), {}, tmp_path, stdout=subprocess.DEVNULL)
    _wait_for_a_step(tmp_path / "r", proc)
    proc.send_signal(getattr(signal, name))
    _, err = proc.communicate(timeout=120)
    with open(tmp_path / "r" / ".rlplane.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if a process still holds the run
    left = _group_left(proc.pid)
    last = err.strip().splitlines()[-1:]
    if "Traceback" in err:
        verdict = "traceback"
    elif left:
        verdict = "wrong: a process of the run is left"
    else:
        ok = proc.returncode == 128 + getattr(signal, name) and bool(last) and (
            last[0].startswith(f"rlplane: stopped by {name}") or last[0] == "rlplane: interrupted")
        verdict = "one-line" if ok else f"wrong: exit {proc.returncode}, {err.strip().splitlines()[-2:]}"
    RESULTS[cid] = verdict
    assert verdict == "one-line", f"{cid}: {verdict}\n{err[-1500:]}"


ASYNC_IN_A_PROCESS = ["grpo.async_grpo.enabled=true", "loss_fn.use_importance_sampling_correction=true",
                      "grpo.async_grpo.collector_process=true"]


def test_a_closed_terminal_stops_an_async_run_at_a_step_boundary(world, tmp_path):
    """The terminal closes under a run whose collector is a child process: writes to the terminal fail (EIO) and
    SIGHUP reaches the whole process group twice (from the shell, then from the kernel as the shell exits). The
    run stops after the step in progress with a checkpoint (exit 129), leaves no process behind, and resumes."""
    master, terminal = pty.openpty()
    argv = _fill(["train", *TINY, *ASYNC_IN_A_PROCESS, "grpo.max_num_steps=100000",
                  "checkpointing.save_period=100000", "run_dir={t}/r"], world, tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "rlplane.cli", *argv], cwd=tmp_path, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                            stdin=terminal, stdout=terminal, stderr=terminal)
    os.close(terminal)
    try:
        _wait_for_a_step(tmp_path / "r", proc)
        os.close(master)  # the terminal hangs up
        for _ in range(2):
            os.killpg(proc.pid, signal.SIGHUP)
            time.sleep(0.2)
        assert proc.wait(timeout=120) == 128 + signal.SIGHUP
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(PARENT_POLL_S * 4)  # an orphaned child would see its parent gone by then
    assert not _group_left(proc.pid), "a process of the run is left"
    done = (tmp_path / "r" / "logs" / "metrics.jsonl").read_text().count("\n")
    assert sorted(p.name for p in (tmp_path / "r" / "checkpoints").glob("step_*")) == [f"step_{done}"]
    resumed = _console(_fill(["train", "--quiet", *TINY, *ASYNC_IN_A_PROCESS, f"grpo.max_num_steps={done + 1}",
                              "checkpointing.resume=true", "run_dir={t}/r"], world, tmp_path), {}, tmp_path,
                       stdout=subprocess.DEVNULL)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-1500:]


def test_a_reader_that_leaves_early_is_no_traceback(world, tmp_path):
    """`rlplane show-config | head -1`: the pipe closes under the writer (SIGPIPE is ignored by Python)."""
    proc = _console(["show-config"], {}, tmp_path, stdout=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()
    _, err = proc.communicate(timeout=300)
    RESULTS["signal/sigpipe-show-config"] = verdict = "traceback" if "Traceback" in err else (
        "ok" if not err.strip() else f"wrong: stderr {err.strip().splitlines()[:2]}")
    assert verdict == "ok", err[-1500:]


def surface_counts(results: dict[str, str]) -> dict[str, dict[str, int]]:
    """Per surface (the case id's first part): one-line errors, correct runs (ok), tracebacks, wrong behaviours,
    and what is missing (known, built elsewhere)."""
    out: dict[str, dict[str, int]] = {}
    for cid, verdict in sorted(results.items()):
        row = out.setdefault(cid.split("/")[0], {"one-line": 0, "ok": 0, "traceback": 0, "wrong": 0, "missing": 0})
        row[verdict.split(":")[0] if verdict.startswith(("wrong", "missing")) else verdict] += 1
    return out


def test_matrix_counts():
    """Runs last in this file: the tally the issue asks for (printed with -s, and in the failure)."""
    one = sum(v == "one-line" for v in RESULTS.values())
    ran = sum(v == "ok" for v in RESULTS.values())
    tb = sum(v == "traceback" for v in RESULTS.values())
    wrong = {k: v for k, v in RESULTS.items() if v.startswith("wrong")}
    print(f"\nbad-input matrix: {len(RESULTS)} commands, {one} one-line errors, {ran} correct runs, {tb} tracebacks, "
          f"{len(wrong)} wrong")
    for surface, row in surface_counts(RESULTS).items():
        print(f"  {surface:10s} {sum(row.values()):4d} inputs: {row['one-line']} one-line errors, {row['ok']} ran "
              f"correctly, {row['traceback']} tracebacks, {row['wrong']} wrong, {row['missing']} missing")
    if os.environ.get("RLPLANE_MATRIX_JSON"):  # for a report: the same tally as JSON
        Path(os.environ["RLPLANE_MATRIX_JSON"]).write_text(json.dumps(surface_counts(RESULTS), indent=1) + "\n")
    if len(RESULTS) >= (len(CASES) + len(ALL_API_CASES) + len(ENV_CASES) + len(EXPECTING_CASES)
                        + len(SERVER_IDS)):  # the whole file ran (not a -k selection)
        assert len(RESULTS) >= 200
        assert tb == 0 and not wrong, json.dumps({k: v for k, v in RESULTS.items() if v not in ("one-line", "ok")},
                                                 indent=1)
