"""Exact-match rewards and task-name routing."""

import pytest
import torch

from rlplane.envs import (
    ArithmeticEnv,
    EnvironmentReturn,
    UnknownEnvironmentError,
    create_env,
    create_envs,
    extract_answer,
    register_env,
    score_answer,
    score_answers,
)


def _log(answer: str) -> list[dict]:
    return [{"role": "user", "content": "12+34=", "token_ids": [1]},
            {"role": "assistant", "content": answer, "token_ids": []}]


@pytest.mark.parametrize(
    "response, reward",
    [
        ("46", 1.0),
        (" 46 ", 1.0),  # surrounding whitespace is stripped
        ("46<eos>", 1.0),  # stop at eos (decoded with special tokens kept)
        ("46<eos>99", 1.0),  # anything after eos is ignored
        ("46\n", 1.0),
        ("47", 0.0),
        ("046", 0.0),  # exact string match, not numeric equality
        ("4 6", 0.0),
        ("", 0.0),
        ("<eos>46", 0.0),
    ],
)
def test_score_answer(response, reward):
    assert score_answer(response, "46") == reward


def test_extract_answer():
    assert extract_answer("  -5<eos><pad><pad>") == "-5"
    assert extract_answer("12</s>", end_markers=("</s>",)) == "12"


def test_env_step_rewards_and_shapes():
    env = ArithmeticEnv()
    logs = [_log("46<eos>"), _log("45"), [{"role": "user", "content": "1+1=", "token_ids": [1]}]]
    meta = [{"ground_truth": "46"}, {"ground_truth": "46"}, {"ground_truth": "2"}]
    ret = env.step(logs, meta)
    assert isinstance(ret, EnvironmentReturn)
    assert torch.equal(ret.rewards, torch.tensor([1.0, 0.0, 0.0]))
    assert ret.rewards.dtype == torch.float32
    assert ret.terminateds.tolist() == [True, True, True]
    assert ret.answers == ["46", "45", ""]
    assert [o["content"] for o in ret.observations] == ["Environment: correct", "Environment: "
                                                                                "incorrect", "Environment: incorrect"]
    assert ret.next_stop_strings == [None, None, None]
    assert ret.metadata == meta
    assert env.metrics(ret.rewards)["accuracy"] == pytest.approx(1 / 3)


def test_score_answers_vector():
    assert score_answers(["1", "2<eos>", "x"], ["1", "2", "3"]).tolist() == [1.0, 1.0, 0.0]


def test_registry_routes_and_errors(request):
    from rlplane.envs import ENV_REGISTRY

    # Later tests list the known environments: leave the registry as it was.
    request.addfinalizer(lambda: ENV_REGISTRY.pop("arithmetic_custom_eos", None))
    assert isinstance(create_env("arithmetic"), ArithmeticEnv)
    envs = create_envs(["arithmetic", "arithmetic"])
    assert list(envs) == ["arithmetic"]
    with pytest.raises(UnknownEnvironmentError, match="task_name 'nope': no environment "
                                                      "registered; known: .*arithmetic"):
        create_env("nope")
    register_env("arithmetic_custom_eos", lambda: ArithmeticEnv(end_markers=("</s>",)))
    env = create_env("arithmetic_custom_eos")
    assert env.step([_log("7</s>")], [{"ground_truth": "7"}]).rewards.tolist() == [1.0]


@pytest.mark.parametrize(
    "answer, correct, fmt",
    [
        ("46", 1.0, 1.0),
        ("47", 0.0, 1.0),  # wrong but well formed
        ("046", 0.0, 0.0),  # leading zero
        ("4 6", 0.0, 0.0),
        ("-0", 0.0, 0.0),
        ("abc", 0.0, 0.0),
        ("", 0.0, 0.0),
    ],
)
def test_reward_components_are_correctness_and_format(answer, correct, fmt):
    env = ArithmeticEnv()
    ret = env.step([_log(answer)], [{"ground_truth": "46"}])
    assert set(ret.reward_components) == set(env.reward_component_names) == {"correct", "format"}
    assert ret.reward_components["correct"].tolist() == [correct] == ret.rewards.tolist()
    assert ret.reward_components["format"].tolist() == [fmt]
