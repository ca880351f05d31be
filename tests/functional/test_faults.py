"""Fault injection on Ray (CPU, the embedded tiny model): each fault either is recovered from or ends the
run with one attributable ``rlplane:`` line, leaving the last checkpoint whole and ``logs/prompts.jsonl``
consistent (every logged step once, no prompt drawn twice).

The driver is this process (``rlplane.cli.main`` on the shared Ray instance); a fault is injected at
the start of a chosen step (``Session.begin_step``), either from the driver (``ray.kill``) or inside an
actor (``__ray_call__`` patches the actor's engine or trainer to SIGKILL its own process, hang or return
NaN). SIGTERM and SIGHUP go to a driver of its own (``rlplane train`` in a subprocess joining the same Ray);
the disk-full fault writes checkpoints to a small tmpfs (skipped where ``mount`` is refused).
``FAULTS_REPORT=path`` appends one line per scenario (name, outcome, seconds from injection to outcome).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rlplane.cli import main
from rlplane.training import Session
from tests.tiny import TINY_RUN

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TINY = [*TINY_RUN, "runtime=ray", "data_plane.backend=ray", "grpo.num_generations_per_prompt=4",
        "policy.train_global_batch_size=8", "policy.train_micro_batch_size=8", "policy.logprob_batch_size=8",
        "grpo.val_at_end=false", "policy.generation.max_new_tokens=3", "logger.progress_bar=false",
        "grpo.max_num_steps=3", "checkpointing.keep_top_k=null", "checkpointing.resume=true"]

TASKS = '''
import time
CALLS = [0]

def odd(prompt, completion, extra):
    return float(completion[:1] in ("1", "3", "5", "7", "9"))

def hang_after_first_step(prompt, completion, extra):
    CALLS[0] += 1
    if CALLS[0] > 8:  # one step of 2 prompts x 4 samples scored
        time.sleep(3600)
    return odd(prompt, completion, extra)

def raise_on_every_third(prompt, completion, extra):
    CALLS[0] += 1
    if CALLS[0] % 3 == 0:
        raise RuntimeError("reward function crashed")
    return odd(prompt, completion, extra)

from rlplane.envs.math_env import PooledVerifierEnv

class DyingVerifierEnv(PooledVerifierEnv):
    """Scores in one verifier process, which SIGKILLs itself on its first answer."""
    verify_fn = "fault_verify:verify_or_die"

    def __init__(self, **kwargs):
        super().__init__(num_workers=1, timeout_s=30)

    def verifier_args(self, response, metadata):
        return (response, str(metadata["ground_truth"]))
'''

# The verifier process imports this module only (not rlplane, not torch).
VERIFY = '''
import os, signal

def verify_or_die(response, truth):
    marker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "verifier_killed")
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return float(response.strip() == truth), response
'''


@pytest.fixture
def local_cwd(tmp_path, monkeypatch):
    """A working directory holding the scenarios' user tasks (importable in the driver and the actors)."""
    (tmp_path / "fault_tasks.py").write_text(TASKS)
    (tmp_path / "fault_verify.py").write_text(VERIFY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("fault_tasks", None)
    return tmp_path


@pytest.fixture
def cwd(local_cwd, ray_session):
    """:func:`local_cwd`, with the shared Ray instance."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the in-actor patches below travel by value
    return local_cwd


def report(name: str, outcome: str, seconds: float) -> None:
    line = f"| {name} | {outcome} | {seconds:.1f} |"
    print(line)
    if path := os.environ.get("FAULTS_REPORT"):
        with open(path, "a") as f:
            f.write(line + "\n")


# ---- what every scenario checks -------------------------------------------------------------------

def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def checkpoints(run_dir: Path) -> list[str]:
    ck = run_dir / "checkpoints"
    return sorted(p.name for p in ck.iterdir()) if ck.is_dir() else []


def check_state(run_dir: Path, last_checkpoint: int, saved: list[int] | None = None) -> None:
    """The checkpoints are exactly ``saved`` (default: step_1..step_N), each whole (no tmp_ left), and
    prompts.jsonl logs the steps 1.. once each, at least up to the last, with no prompt drawn twice."""
    saved = list(range(1, last_checkpoint + 1)) if saved is None else saved
    assert checkpoints(run_dir) == [f"step_{i}" for i in saved], checkpoints(run_dir)
    for i in saved:
        assert (run_dir / "checkpoints" / f"step_{i}" / "training_info.json").is_file()
    ledger = rows(run_dir / "logs" / "prompts.jsonl")
    steps = [r["step"] for r in ledger]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= last_checkpoint, steps
    drawn = [tuple(p) for r in ledger for p in r["drawn"]]
    assert len(drawn) == len(set(drawn)), drawn


def train(run_dir: Path, *extra: str) -> int:
    return main(["train", "--quiet", *TINY, f"run_dir={run_dir}", *extra])


class Injected:
    """Runs ``inject(session)`` at the start of step ``step`` (from 0) and notes when."""

    def __init__(self, monkeypatch, step: int, inject):
        self.at: float | None = None
        real = Session.begin_step

        def begin_step(s, i):
            if i == step and self.at is None:
                self.at = time.monotonic()
                inject(s)
            return real(s, i)

        monkeypatch.setattr(Session, "begin_step", begin_step)


def fails_with_one_line(capsys, run_dir: Path, injected: Injected, name: str, *extra: str, rc: int = 2) -> str:
    """The run ends with return code ``rc`` and exactly one stderr line; returns it."""
    got = train(run_dir, *extra)
    seconds = time.monotonic() - injected.at
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert got == rc and len(err) == 1, (got, err)
    assert seconds < 60
    report(name, f"`{err[0]}`", seconds)
    return err[0]


def resumes(run_dir: Path, steps: int = 3) -> None:
    """The run resumed from its checkpoint finishes, every step logged once."""
    assert train(run_dir, f"grpo.max_num_steps={steps}") == 0
    check_state(run_dir, steps)


# ---- faults injected inside an actor (run there through __ray_call__) --------------------------------

def _die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


def _hang(*args, **kwargs):
    threading.Event().wait()


def engine_dies_in_generate(actor) -> None:
    actor.backend.generate = _die


def engine_hangs_in_generate(actor) -> None:
    actor.backend.generate = _hang


def engine_dies_in_weight_update(actor) -> None:
    actor.backend.update_weights = _die


def trainer_dies(actor) -> None:
    actor.trainer.train_global_batches = _die


def engine_returns_nan_logprobs(actor) -> None:
    import torch

    real = actor.backend.generate

    def generate(*args, **kwargs):
        out = real(*args, **kwargs)
        out.logprobs = [torch.full_like(lp, float("nan")) for lp in out.logprobs]
        return out

    actor.backend.generate = generate


def in_actor(handle, fn) -> None:
    import ray

    ray.get(handle.__ray_call__.remote(fn))


def generator(s):
    return s.workers.rollout.group.workers[0]


# ---- the scenarios ----------------------------------------------------------------------------------

def test_rollout_actor_killed_idle(cwd, capsys, monkeypatch):
    import ray

    injected = Injected(monkeypatch, 1, lambda s: ray.kill(generator(s)))
    line = fails_with_one_line(capsys, cwd / "run", injected, "rollout actor killed idle")
    # The refit's next call to it meets the death: which one is first depends on Ray's timing.
    assert re.fullmatch(r"rlplane: error: generator 0 died during (set_weight_version|update_weights) \(killed\); the "
                        r"run stops: resume from its last checkpoint with checkpointing.resume=true", line), line
    check_state(cwd / "run", 1)
    resumes(cwd / "run")


def test_rollout_actor_killed_mid_generation(cwd, capsys, monkeypatch):
    injected = Injected(monkeypatch, 1, lambda s: in_actor(generator(s), engine_dies_in_generate))
    line = fails_with_one_line(capsys, cwd / "run", injected, "rollout actor killed mid-generation")
    assert line.startswith("rlplane: error: generator 0 died during rollout (its process exited)"), line
    check_state(cwd / "run", 1)


def test_policy_rank_killed_mid_train(cwd, capsys, monkeypatch):
    injected = Injected(monkeypatch, 1, lambda s: in_actor(s.workers.policy.workers[1], trainer_dies))
    line = fails_with_one_line(capsys, cwd / "run", injected, "policy rank 1 of 2 killed mid-train", "policy.dp_size=2")
    # Rank 0 may fail first in the gradient all-reduce its peer left: then it is named (one line either way).
    assert line.startswith("rlplane: error: policy rank 1 died during train") or "policy rank 0" in line, line
    check_state(cwd / "run", 1)


def test_actor_killed_during_weight_sync(cwd, capsys, monkeypatch):
    injected = Injected(monkeypatch, 1, lambda s: in_actor(generator(s), engine_dies_in_weight_update))
    line = fails_with_one_line(capsys, cwd / "run", injected, "generator killed during the weight sync")
    assert line.startswith("rlplane: error: generator 0 died during update_weights (its process exited)"), line
    check_state(cwd / "run", 1)


def test_verifier_process_killed_is_replaced(cwd, monkeypatch):
    t0 = time.monotonic()
    assert train(cwd / "run", "env.arithmetic.class=fault_tasks:DyingVerifierEnv", "grpo.max_num_steps=2") == 0
    assert (cwd / "verifier_killed").is_file()  # the verifier process did die
    check_state(cwd / "run", 2)
    report("verifier process killed", "recovered: the pool replaced its process, that answer scored 0; rc 0",
           time.monotonic() - t0)


def test_reward_function_hangs(cwd, capsys, monkeypatch):
    injected = Injected(monkeypatch, 1, lambda s: None)
    line = fails_with_one_line(capsys, cwd / "run", injected, "reward function hangs",
                               "env.arithmetic.reward_fn=fault_tasks:hang_after_first_step", "env.step_timeout_s=2")
    assert "did not return within 2 s (env.step_timeout_s = 2)" in line, line
    check_state(cwd / "run", 1)


def test_reward_function_raises_is_scored_zero(cwd):
    t0 = time.monotonic()
    assert train(cwd / "run", "env.arithmetic.reward_fn=fault_tasks:raise_on_every_third", "grpo.max_num_steps=2",
                 "env.max_error_rate=0.9") == 0
    failures = [r.get("train/rollout_failures", 0) for r in rows(cwd / "run" / "logs" / "metrics.jsonl")]
    assert sum(failures) > 0
    check_state(cwd / "run", 2)
    report("reward function raises", f"recovered: rollout_failure_policy zero_reward scored {sum(failures):g} "
           "samples 0; rc 0", time.monotonic() - t0)


def test_nan_logprobs_from_the_generator(cwd, capsys, monkeypatch):
    injected = Injected(monkeypatch, 1, lambda s: in_actor(generator(s), engine_returns_nan_logprobs))
    line = fails_with_one_line(capsys, cwd / "run", injected, "NaN logprobs from the generator")
    assert line.startswith("rlplane: error: generator: non-finite logprobs in 8 of 8 samples"), line
    check_state(cwd / "run", 1)


def test_data_plane_store_actor_killed(cwd, capsys, monkeypatch):
    import ray

    injected = Injected(monkeypatch, 1, lambda s: ray.kill(s.data_plane.placement.actor))
    line = fails_with_one_line(capsys, cwd / "run", injected, "data-plane store actor killed",
                               "data_plane.index=store")
    assert line.startswith("rlplane: error: data plane: its index's store actor died"), line
    check_state(cwd / "run", 1)


@pytest.fixture
def small_disk(tmp_path):
    """An 8 MiB tmpfs (root only), unmounted after."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"no tmpfs here: {out.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_during_checkpoint_write(cwd, capsys, monkeypatch, small_disk):
    def fill(s):  # step_1 is written; leave the disk 8 KiB for step_2
        st = os.statvfs(small_disk)
        fd = os.open(small_disk / "filler", os.O_WRONLY | os.O_CREAT)
        os.posix_fallocate(fd, 0, st.f_bavail * st.f_frsize - 8192)
        os.close(fd)

    injected = Injected(monkeypatch, 1, fill)
    line = fails_with_one_line(capsys, cwd / "run", injected, "disk full during a checkpoint write (8 MiB tmpfs)",
                               f"checkpointing.checkpoint_dir={small_disk / 'ck'}")
    assert line.startswith(f"rlplane: error: checkpoint {small_disk / 'ck' / 'tmp_step_2'}: cannot write it"), line
    assert sorted(p.name for p in (small_disk / "ck").iterdir()) == ["step_1"]
    assert (small_disk / "ck" / "step_1" / "training_info.json").is_file()


def test_watchdog_names_the_stuck_worker_and_dumps_stacks(cwd, capsys, monkeypatch):
    injected = Injected(monkeypatch, 1, lambda s: in_actor(generator(s), engine_hangs_in_generate))
    # 10 s: a first training call on a loaded machine has taken over 3 s on Ray, and the watchdog then named it.
    line = fails_with_one_line(capsys, cwd / "run", injected, "generator hangs (watchdog 10 s)", "grpo.watchdog_s=10",
                               "policy.generation.timeout_s=null")
    stacks = cwd / "run" / "logs" / "stacks.txt"
    assert line.startswith("rlplane: error: watchdog: no progress for 10 s (grpo.watchdog_s = 10); stuck: generator 0 "
                           "(rollout, running "), line
    assert f"every worker's stack is in {stacks}" in line
    text = stacks.read_text()
    assert "== driver" in text and "== generator 0" in text and "== policy rank 0" in text
    assert "in _hang" in text  # the stuck actor's own frame
    print(text)
    check_state(cwd / "run", 1)


def test_watchdog_in_a_local_run(local_cwd, capsys, monkeypatch):
    """runtime: local: the stuck call is in this process; the watchdog wakes the main thread with SIGINT."""
    def hang(s):
        s.workers.rollout.group.workers[0].backend.generate = _hang

    injected = Injected(monkeypatch, 1, hang)
    line = fails_with_one_line(capsys, local_cwd / "run", injected, "local generator hangs (watchdog 2 s)",
                               "runtime=local", "data_plane.backend=memory", "grpo.watchdog_s=2",
                               "policy.generation.timeout_s=null")
    assert line.startswith("rlplane: error: watchdog: no progress for 2 s (grpo.watchdog_s = 2); stuck: generator 0 "
                           "(rollout, running "), line
    assert "in _hang" in (local_cwd / "run" / "logs" / "stacks.txt").read_text()
    check_state(local_cwd / "run", 1)


def test_sigint_stops_at_the_step_boundary_and_resumes(cwd, capsys, monkeypatch):
    injected = Injected(monkeypatch, 1, lambda s: os.kill(os.getpid(), signal.SIGINT))
    line = fails_with_one_line(capsys, cwd / "run", injected, "SIGINT to the driver", "checkpointing.save_period=5",
                               rc=128 + signal.SIGINT)
    assert line == (f"rlplane: stopped by SIGINT after step 2 (checkpoint {cwd / 'run' / 'checkpoints' / 'step_2'}; "
                    "resume with checkpointing.resume=true)")
    check_state(cwd / "run", 2, saved=[2])
    assert train(cwd / "run", "grpo.max_num_steps=3") == 0
    check_state(cwd / "run", 3, saved=[2, 3])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_to_a_driver_process_stops_it_and_resumes(cwd, ray_session, sig):
    """A driver of its own joining this Ray (ray.init there installs Ray's SIGTERM handler: ours replaces it)."""
    run_dir = cwd / "run"
    address = ray_session.get_runtime_context().gcs_address
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, "-m", "rlplane.cli", "train", "--quiet", *TINY, f"run_dir={run_dir}",
                             f"cluster.address={address}", "grpo.max_num_steps=50", "checkpointing.save_period=50"],
                            cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None and not rows(run_dir / "logs" / "prompts.jsonl"):
        time.sleep(0.05)
    at = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    seconds = time.monotonic() - at
    # Ray's own start-up lines (joining the cluster) come first; then ours, alone.
    ours = [line for line in err.splitlines() if line.startswith("rlplane:")]
    assert proc.returncode == 128 + sig and len(ours) == 1, (proc.returncode, err)
    assert err.strip().splitlines()[-1] == ours[0] and "Traceback" not in err, err
    report(f"{sig.name} to the driver", f"`{ours[0]}`", seconds)
    assert ours[0].startswith(f"rlplane: stopped by {sig.name} after step ")
    done = int(ours[0].split("after step ")[1].split(" ")[0])
    check_state(run_dir, done, saved=[done])  # no checkpoint was due: the stop wrote step_<done>
    assert train(run_dir, f"grpo.max_num_steps={done + 1}", "checkpointing.save_period=50") == 0
    check_state(run_dir, done + 1, saved=[done, done + 1])


def test_a_closed_terminal_stops_a_driver_and_the_local_ray_it_started(cwd):
    """SIGHUP reaches the driver's whole process group twice (from the shell, then the kernel as the shell exits),
    the local Ray the driver started included: Ray's processes ignore it, the driver stops at the step boundary,
    leaves no process behind, and the run resumes."""
    run_dir = cwd / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, "-m", "rlplane.cli", "train", "--quiet", *TINY, f"run_dir={run_dir}",
                             "cluster.num_cpus=2", "grpo.max_num_steps=50", "checkpointing.save_period=50"],
                            cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    while proc.poll() is None and not rows(run_dir / "logs" / "prompts.jsonl"):
        time.sleep(0.05)
    at = time.monotonic()
    for _ in range(2):
        os.killpg(proc.pid, signal.SIGHUP)
        time.sleep(0.2)
    _, err = proc.communicate(timeout=120)
    seconds = time.monotonic() - at
    ours = [line for line in err.splitlines() if line.startswith("rlplane:")]
    assert proc.returncode == 128 + signal.SIGHUP and len(ours) == 1 and "Traceback" not in err, (proc.returncode, err)
    report("SIGHUP to the driver's process group (its local Ray in it)", f"`{ours[0]}`", seconds)
    for _ in range(100):  # Ray's processes end with the driver's ray.shutdown
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("a process of the run's group is left")
    done = int(ours[0].split("after step ")[1].split(" ")[0])
    check_state(run_dir, done, saved=[done])
    assert train(run_dir, f"grpo.max_num_steps={done + 1}", "checkpointing.save_period=50") == 0
    check_state(run_dir, done + 1, saved=[done, done + 1])
