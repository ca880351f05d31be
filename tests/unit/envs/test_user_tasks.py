"""User tasks by import path (env.<task>.reward_fn / class): imports, checks, one-line errors."""

from __future__ import annotations

import json
import sys

import pytest

from rlplane.cli import main
from rlplane.config.loading import ConfigError, load_config
from rlplane.envs.user import UserTaskError, check_user_tasks, make_user_env

MODULE = '''
def score(prompt, completion, extra, bonus=0.0):
    return (1.0 if completion.strip() == extra["ground_truth"] else 0.0) + bonus

def parts(prompt, completion, extra):
    return [0.25, 0.5]            # GDPO-style components: summed into the reward

def two_args(prompt, completion):
    return 1.0

def text(prompt, completion, extra):
    return "high"

def uses_extra(prompt, completion, extra):
    return float(extra["weight"]) * len(prompt)

class Echo:
    def __init__(self, scale=1.0):
        self.scale = scale
    def step(self, message_logs, metadata):
        from rlplane.envs import EnvironmentReturn
        n = len(message_logs)
        return EnvironmentReturn([{}] * n, list(metadata), [None] * n, torch.full((n,), self.scale),
                                 torch.ones(n, dtype=torch.bool), None)

import torch
NOT_CALLABLE = 3
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module `my_rewards` in a fresh working directory (found relative to it, as a user's would be)."""
    name = f"my_rewards_{tmp_path.name.replace('-', '_')}"  # unique per test: no stale sys.modules entry
    (tmp_path / f"{name}.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    yield name
    sys.modules.pop(name, None)


def _log(prompt, completion):
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]


def test_reward_fn_scores_each_sample(user_module):
    env = make_user_env("t", f"{user_module}:score", None, bonus=0.5)
    ret = env.step([_log("1+2=", "3"), _log("1+2=", " 4")], [{"ground_truth": "3"}, {"ground_truth": "3"}])
    assert ret.rewards.tolist() == [1.5, 0.5]  # right + bonus 0.5; wrong, bonus only
    assert ret.terminateds.tolist() == [True, True]
    # A list of components is summed: 0.25 + 0.5 = 0.75.
    env = make_user_env("t", f"{user_module}:parts", None)
    assert env.step([_log("p", "c")], [{}]).rewards.tolist() == [0.75]
    # `extra` carries the row's other fields; `prompt` is the prompt text: 2.0 * len("ab=") = 6.
    env = make_user_env("t", f"{user_module}:uses_extra", None)
    assert env.step([_log("ab=", "c")], [{"ground_truth": "x", "weight": 2}]).rewards.tolist() == [6.0]


def test_env_class_built_with_kwargs(user_module):
    env = make_user_env("t", None, f"{user_module}:Echo", scale=0.25)
    assert env.step([_log("p", "c")] * 2, [{}, {}]).rewards.tolist() == [0.25, 0.25]


@pytest.mark.parametrize("path, kind, expected", [
    ("nowhere_module:score", "reward_fn", "no module named 'nowhere_module' in the working directory"),
    ("{m}:scor", "reward_fn", "has no 'scor'; it defines: Echo, NOT_CALLABLE,"),
    ("{m}:two_args", "reward_fn", "cannot be called as fn(prompt, completion, extra, **kwargs)"),
    ("{m}:NOT_CALLABLE", "reward_fn", "is a int, not a function"),
    ("{m}:score", "class", "not a class with a step(message_logs, metadata) method"),
])
def test_import_and_signature_errors(user_module, path, kind, expected):
    path = path.format(m=user_module)
    with pytest.raises(UserTaskError) as e:
        make_user_env("t", path if kind == "reward_fn" else None, path if kind == "class" else None)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"env.t.{kind} = {path!r}: ") and expected in msg


def test_non_number_return_is_caught_before_training(user_module, tmp_path):
    from rlplane.data.datum import make_prompt_datum
    from rlplane.models.tiny import build_char_tokenizer

    datum = make_prompt_datum("1+2=", "3", build_char_tokenizer(), idx=0, task_name="t")
    cfg = load_config(None, [f"env.t.reward_fn={user_module}:text"])
    with pytest.raises(UserTaskError, match=r"^env.t.reward_fn returned 'high' \(str\); return a float"):
        check_user_tasks(cfg.env, [datum])
    # A correct one passes, and it is called with the reference answer as the completion.
    check_user_tasks(load_config(None, [f"env.t.reward_fn={user_module}:score"]).env, [datum])


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"^env.maht: not an environment section .* did you mean env.math\?"):
        load_config(None, ["env.maht.num_workers=3"])
    with pytest.raises(ConfigError, match=r"^env.t.kwarg: unknown key; did you mean env.t.kwargs\?$"):
        load_config(None, ["env.t.reward_fn=a:b", "env.t.kwarg=1"])
    with pytest.raises(ConfigError, match=r"env.t.reward_fn: set exactly one of reward_fn"):
        load_config(None, ["env.t.reward_fn=a:b", "env.t.class=a:C"])
    with pytest.raises(ConfigError, match=r"env.t.reward_fn = 'ab': expected module:attribute"):
        load_config(None, ["env.t.reward_fn=ab"])


def test_user_task_survives_the_saved_config():
    import yaml

    from rlplane.config.loading import build_config, dump_config

    cfg = load_config(None, ["env.t.class=m:C", "env.t.kwargs={a: 1}"])
    again = build_config(yaml.safe_load(dump_config(cfg)))
    assert again.env.user_tasks()["t"].class_ == "m:C" and again.env.env_kwargs("t") == {"a": 1}


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_cli_wrong_path_is_one_line_before_training(user_module, tmp_path, capsys):
    data = _jsonl(tmp_path / "d.jsonl", [{"problem": "1+2=", "answer": "3", "weight": 2}] * 40)
    common = ["data.dataset=jsonl", f"data.train.path={data}", "data.train.default_task_name=t",
              f"run_dir={tmp_path / 'run'}", "warmup.enabled=false"]
    for path, expected in [(f"{user_module}:nope", f"rlplane: error: env.t.reward_fn = '{user_module}:nope': "),
                           (f"{user_module}:text", "rlplane: error: env.t.reward_fn returned 'high' (str)")]:
        rc = main(["train", *common, f"env.t.reward_fn={path}"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and err[0].startswith(expected), err
    assert not (tmp_path / "run" / "logs" / "metrics.jsonl").exists()  # stopped before anything was logged
    assert not (tmp_path / "run" / "config.yaml").exists()  # nor is the run dir claimed
