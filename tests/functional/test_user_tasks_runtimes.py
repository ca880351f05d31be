"""A user's reward function named by import path trains under both runtimes, imported inside the
process that runs the environment (the Ray rollout actor under runtime: ray)."""

from __future__ import annotations

import json
import os

import pytest

import rlplane

REWARD_MODULE = '''
import os

def score(prompt, completion, extra):
    # Which process ran this, and from where (the test reads it back).
    with open(extra["log"], "a") as f:
        f.write(f"{os.getpid()} {os.getcwd()}\\n")
    return float(completion.strip() == extra["ground_truth"])
'''

TINY = ["grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=4", "policy.train_global_batch_size=16",
        "policy.train_micro_batch_size=16", "policy.logprob_batch_size=16", "grpo.max_num_steps=2",
        "grpo.val_period=2", "grpo.max_val_samples=8", "grpo.val_batch_size=8", "warmup.enabled=false",
        "logger.tensorboard_enabled=false", "checkpointing.enabled=false", "logger.progress_bar=false"]


@pytest.mark.parametrize("runtime", ["local", pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.slow])])
def test_reward_fn_by_path_runs_where_the_env_runs(runtime, tmp_path, monkeypatch, request):
    if runtime == "ray":
        request.getfixturevalue("ray_session")
    name = f"user_reward_{runtime}"
    work = tmp_path / "work"
    work.mkdir()
    (work / f"{name}.py").write_text(REWARD_MODULE)
    calls = tmp_path / "calls.txt"
    rows = [{"problem": f"{a}+{a}=", "answer": str(2 * a), "log": str(calls)} for a in range(20)]
    (work / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.chdir(work)  # the module is found relative to the working directory
    summary = rlplane.train(None, overrides=[
        *TINY, f"runtime={runtime}", f"data_plane.backend={'ray' if runtime == 'ray' else 'memory'}",
        "data.dataset=jsonl", "data.train.path=d.jsonl", "data.train.default_task_name=mine",
        f"env.mine.reward_fn={name}:score", f"run_dir={tmp_path / 'run'}"], quiet=True)
    lines = [line.split(" ", 1) for line in calls.read_text().splitlines()]
    pids, cwds = [int(p) for p, _ in lines], {c for _, c in lines[1:]}
    # 1 start-up check + validation at 0 and 2 (8 each) + 2 steps x 16 samples = 49 calls.
    assert len(pids) == 1 + 8 + 8 + 32
    assert pids[0] == os.getpid()  # the start-up check runs in the driver
    rollout_pids = set(pids[1:])
    if runtime == "local":
        assert rollout_pids == {os.getpid()}
    else:
        assert len(rollout_pids) == 1 and os.getpid() not in rollout_pids  # imported in the rollout actor
        # Ray started before the chdir, so the actor runs elsewhere: the driver's working directory
        # reached it through RLPLANE_IMPORT_PATH, not through its own cwd.
        assert cwds and str(work) not in cwds
    assert summary["accuracy_after"] is not None


@pytest.mark.slow
@pytest.mark.ray
def test_actor_that_cannot_import_the_task_fails_in_one_line(ray_session, tmp_path, monkeypatch, capsys):
    """The driver imports the module from a path only it has; the rollout actor cannot: one line, exit 2
    (not a run whose every sample silently scores 0)."""
    from rlplane.cli import main

    lib = tmp_path / "driver_only"
    lib.mkdir()
    (lib / "driver_only_reward.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(lib))
    monkeypatch.chdir(tmp_path)
    rows = [{"problem": f"{a}+{a}=", "answer": str(2 * a), "log": str(tmp_path / "calls.txt")} for a in range(20)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc = main(["train", *TINY, "runtime=ray", "data_plane.backend=ray", "data.dataset=jsonl", "data.train.path=d.jsonl",
               "data.train.default_task_name=mine", "env.mine.reward_fn=driver_only_reward:score",
               f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("rlplane: error: env.mine.reward_fn = 'driver_only_reward:score': no module named")
    assert err[0].endswith("(in the Ray rollout actor)")
