"""User code (reward functions, environment classes) cannot end a run as a success, and its failures are
the user's, in one line naming the module and function: sys.exit(), a failing constructor, a task name
no row carries, one reward for a whole batch, an environment that keeps failing."""

from __future__ import annotations

import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

import rlplane
from rlplane.cli import main
from rlplane.envs import ENV_REGISTRY, EnvironmentReturn, register_env
from rlplane.envs.user import EnvErrorWindow, EnvReturnError, UserTaskError
from rlplane.workers.env_steps import step_task
from tests.tiny import TINY_RUN

TINY = [*TINY_RUN, "grpo.val_at_end=false", "checkpointing.enabled=false", "logger.progress_bar=false"]

USER_MODULE = textwrap.dedent('''
    import sys

    def exits(prompt, completion, extra):
        sys.exit(0)

    def score(prompt, completion, extra):
        return float(completion.strip() == str(extra["ground_truth"]))

    class BrokenEnv:
        def __init__(self):
            raise ValueError("no judge configured")

        def step(self, message_logs, metadata):
            raise AssertionError("never built")
''')


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    name = f"user_code_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


@pytest.fixture
def registry():
    saved = dict(ENV_REGISTRY)
    yield
    ENV_REGISTRY.clear()
    ENV_REGISTRY.update(saved)


def _one_error_line(capsys) -> str:
    lines = [ln for ln in capsys.readouterr().err.strip().splitlines() if ln.startswith("rlplane: error:")]
    assert len(lines) == 1, lines
    return lines[0]


def test_sys_exit_in_a_reward_function_is_the_users_failure_not_a_success(user_module, tmp_path, capsys, registry):
    """It used to end `rlplane train` with exit status 0."""
    rc = main(["train", "--quiet", *TINY, f"run_dir={tmp_path / 'r'}", f"env.arithmetic.reward_fn={user_module}:exits"])
    assert rc == 2
    line = _one_error_line(capsys)
    assert f"{user_module}.exits (" in line and "called sys.exit(0) during the run" in line
    assert "stopped as failed" in line


def test_sys_exit_through_the_python_api_raises(user_module, tmp_path, registry):
    mod = __import__(user_module)
    with pytest.raises(UserTaskError, match=rf"{user_module}\.exits .*called sys.exit\(0\)"):
        rlplane.train(None, overrides=[*TINY, f"run_dir={tmp_path / 'r'}"], reward_fns={"arithmetic": mod.exits},
                      quiet=True)


def test_an_environment_whose_constructor_raises_is_one_line(user_module, tmp_path, capsys, registry):
    """It used to be a 25-line traceback."""
    rc = main(["train", "--quiet", *TINY, f"run_dir={tmp_path / 'r'}", f"env.arithmetic.class={user_module}:BrokenEnv"])
    assert rc == 2
    line = _one_error_line(capsys)
    assert line == (f"rlplane: error: env.arithmetic.class = '{user_module}:BrokenEnv': BrokenEnv(**env kwargs) "
                    "raised ValueError: no judge configured; fix the class or its env.arithmetic.kwargs")
    assert "Traceback" not in capsys.readouterr().err


def test_a_reward_for_a_misspelt_task_is_an_error_at_load(user_module, tmp_path, capsys, registry):
    rc = main(["train", "--quiet", *TINY, f"run_dir={tmp_path / 'r'}", f"env.arithmetc.reward_fn={user_module}:score"])
    assert rc == 2
    line = _one_error_line(capsys)
    assert line.startswith("rlplane: error: env.arithmetc.reward_fn: no training or validation row has task_name "
                           "'arithmetc' (the data's tasks: arithmetic)")


def test_a_python_reward_for_a_task_no_row_names_is_an_error(tmp_path, registry):
    with pytest.raises(UserTaskError, match=r"reward_fns\['no_such_task'\]: no training or validation row"):
        rlplane.train(None, overrides=[*TINY, f"run_dir={tmp_path / 'r'}"],
                      reward_fns={"no_such_task": lambda prompt, completion, extra: 1.0}, quiet=True)


class OneRewardForTheBatch:
    """Scores the batch as a whole: one number, whatever the batch size."""

    def step(self, message_logs, metadata):
        n = len(message_logs)
        return EnvironmentReturn([{}] * n, list(metadata), [None] * n, torch.tensor([0.75]),
                                 torch.ones(n, dtype=torch.bool), None)


def test_one_reward_for_a_whole_batch_stops_naming_the_environment_class():
    """Each sample used to be re-stepped alone, so the batch's one number reached every sample."""
    states = [SimpleNamespace(message_log=[{"role": "user", "content": "1+1="}], env_info={}) for _ in range(4)]
    with pytest.raises(EnvReturnError) as e:
        step_task(OneRewardForTheBatch(), "judge", states, [0, 1, 2, 3], None)
    assert str(e.value) == (f"environment 'judge' ({__name__}.OneRewardForTheBatch) returned one reward for 4 "
                            "samples; return one reward per sample (shape (4,))")


class AlwaysFails:
    def step(self, message_logs, metadata):
        raise RuntimeError("judge unreachable")


def test_an_environment_failing_on_every_sample_stops_the_run(tmp_path, capsys, registry):
    """It used to train on all-zero rewards to the end and exit 0."""
    register_env("arithmetic", AlwaysFails)
    rc = main(["train", *TINY, f"run_dir={tmp_path / 'r'}", "grpo.max_num_steps=4", "env.error_window_steps=2"])
    assert rc == 2
    line = _one_error_line(capsys)
    assert line.startswith("rlplane: error: environments failed on 100% of the samples over the last 1 steps, above "
                           "env.max_error_rate = 0.5")


def test_the_error_window_averages_the_last_steps():
    w = EnvErrorWindow(0.5, window=3)
    for rate in (0.4, 0.6, 0.5, 0.0):  # window means 0.4, 0.5, 0.5, 0.367: never above 0.5
        w.check({"train/env_error_rate": rate})
    w.check({})  # a step without the metric is not judged
    w.check({"train/env_error_rate": 0.9})  # (0.5 + 0 + 0.9) / 3 = 0.467
    with pytest.raises(UserTaskError, match=r"failed on 63% of the samples over the last 3 steps"):
        w.check({"train/env_error_rate": 1.0})  # (0 + 0.9 + 1) / 3 = 0.633
    EnvErrorWindow(None, 3).check({"train/env_error_rate": 1.0})  # null: never stops
