"""runtime: ray with two environments (two task_names) as actor pools: placement.json names their
actors, one actor kills itself during the first step (Ray restarts it; its samples follow
rollout_failure_policy and the run goes on), the other during its first metrics() call (counted, asked
again), each environment's metrics are logged per task, and a task named in env.val_task_to_env validates
in a pool of its own."""

from __future__ import annotations

import json
import os

import pytest

import rlplane
from rlplane.utils.logging import read_metrics

pytestmark = [pytest.mark.ray, pytest.mark.slow]

MODULE = "dies_once_env_for_actor_tests"
SOURCE = '''
import os
import signal

from rlplane.envs.arithmetic import ArithmeticEnv


class DiesOnce(ArithmeticEnv):
    """Arithmetic scoring; the first step outside the driver kills its own process (kill -9)."""

    def __init__(self, marker, driver_pid):
        super().__init__()
        self.marker, self.driver_pid = marker, str(driver_pid)
        with open(marker + ".made", "a") as f:
            f.write(f"{os.getpid()}\\n")

    def step(self, logs, meta):
        if str(os.getpid()) != self.driver_pid and not os.path.exists(self.marker):
            with open(self.marker, "w") as f:
                f.write(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return super().step(logs, meta)


class DiesInMetricsOnce(ArithmeticEnv):
    """Arithmetic scoring; the first metrics() call outside the driver kills its own process (kill -9)."""

    def __init__(self, marker, driver_pid):
        super().__init__()
        self.marker, self.driver_pid = marker, str(driver_pid)

    def metrics(self, rewards, batch=None):
        if str(os.getpid()) != self.driver_pid and not os.path.exists(self.marker):
            with open(self.marker, "w") as f:
                f.write(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return super().metrics(rewards, batch)
'''

TINY = ["grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=2", "policy.train_global_batch_size=8",
        "policy.train_micro_batch_size=8", "policy.logprob_batch_size=8", "grpo.max_num_steps=2",
        "grpo.val_period=2", "grpo.val_at_start=false", "grpo.max_val_samples=4", "grpo.val_batch_size=4",
        "warmup.enabled=false", "policy.generation.max_new_tokens=3", "logger.tensorboard_enabled=false",
        "checkpointing.enabled=false", "logger.progress_bar=false", "data.shuffle=false"]


def test_two_environment_pools_survive_a_killed_actor_and_log_their_metrics(ray_session, tmp_path, monkeypatch,
                                                                             capsys):
    work = tmp_path / "work"
    work.mkdir()
    (work / f"{MODULE}.py").write_text(SOURCE)
    # Alternating tasks: every batch of 4 prompts holds both.
    rows = [{"problem": f"{a}+{a}=", "answer": str(2 * a), "task_name": "arithmetic" if a % 2 else "flaky"}
            for a in range(24)]
    (work / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.chdir(work)
    marker = tmp_path / "died"
    run = tmp_path / "run"
    rlplane.train(None, overrides=[
        *TINY, "runtime=ray", "data_plane.backend=ray", "data.dataset=jsonl", "data.train.path=d.jsonl",
        f"env.flaky.class={MODULE}:DiesOnce", f"env.flaky.kwargs.marker={marker}",
        f"env.flaky.kwargs.driver_pid={os.getpid()}", "env.val_task_to_env.flaky=arithmetic",
        f"env.arithmetic.class={MODULE}:DiesInMetricsOnce", f"env.arithmetic.kwargs.marker={tmp_path / 'metrics'}",
        f"env.arithmetic.kwargs.driver_pid={os.getpid()}",
        f"run_dir={run}"], quiet=False)

    where = json.loads((run / "logs" / "placement.json").read_text())["environments"]
    assert sorted(where) == ["arithmetic", "flaky", "val/flaky"]
    assert [(a["env"], a["actor"]) for a in where["val/flaky"]] == [("arithmetic", 0)]
    pids = {a["pid"] for pool in where.values() for a in pool}
    assert len(pids) == 3 and os.getpid() not in pids and all(a["node_id"] for p in where.values() for a in p)
    # The driver's start-up check, the pool's actor, the same actor restarted by Ray.
    made = marker.with_name("died.made").read_text().split()
    killed = int(marker.read_text())
    assert killed == where["flaky"][0]["pid"] and made[1:] == [str(killed), made[2]] and made[2] != str(killed)

    steps = [r for r in read_metrics(run / "logs") if r["step"] > 0]
    first, second = steps
    assert first["train/env/flaky/actor_deaths"] == 1 and second["train/env/flaky/actor_deaths"] == 0
    # arithmetic's actor died in its first metrics() call: counted in that step, its metrics asked again.
    assert first["train/env/arithmetic/actor_deaths"] == 1 and second["train/env/arithmetic/actor_deaths"] == 0
    assert int((tmp_path / "metrics").read_text()) == where["arithmetic"][0]["pid"]
    # zero_reward: the dead actor's samples (all of the step's flaky ones) scored 0 and were trained on.
    assert first["train/rollout_failures"] == first["train/env/flaky/num_samples"] == 4
    assert second["train/rollout_failures"] == 0
    for task in ("arithmetic", "flaky"):
        for r in steps:
            assert r[f"train/env/{task}/num_samples"] == 4
            assert {"accuracy", "pass@2", "fraction_of_samples_properly_ended", "generation_lengths",
                    "prompt_lengths"} <= {k.rsplit("/", 1)[1] for k in r if k.startswith(f"train/env/{task}/")}
        assert f"validation/env/{task}/accuracy" in second  # flaky's by the arithmetic pool val/flaky
    assert first["train/env/flaky/accuracy"] == 0.0
    said = capsys.readouterr()
    line = [x for x in (said.out + said.err).splitlines() if "environment actor(s)" in x]
    assert sorted(line) == [f"step 1: 1 environment actor(s) of {task!r} died during train and were restarted; the "
                            "samples they held followed grpo.rollout_failure_policy = zero_reward "
                            "(train/rollout_failures = 4, rollout_retries = 0)" for task in ("arithmetic", "flaky")]
