"""The calculator tool environment and the warm-up examples built from its demonstration."""

from __future__ import annotations

import pytest

from rlplane.data.datum import make_prompt_datum
from rlplane.envs import create_env
from rlplane.envs.arithmetic import ArithmeticEnv
from rlplane.envs.calculator import CalculatorEnv, parse_call
from rlplane.envs.demonstrations import warmup_examples
from rlplane.models.tiny import build_char_tokenizer


def _log(*responses):
    return [{"role": "user", "content": "12*34="}, *({"role": "assistant", "content": r} for r in responses)]


def test_parse_call():
    assert parse_call("(12*34)") == (12, "*", 34)
    assert parse_call(" (7 - 9) ") == (7, "-", 9)
    assert parse_call("(12*34)5") is None  # not alone in the response
    assert parse_call("408") is None and parse_call("(12*)") is None


def test_tool_call_then_answer():
    env = create_env("calculator")
    assert isinstance(env, CalculatorEnv)
    meta = [{"ground_truth": "408"}] * 3
    ret = env.step([_log("(12*34)"), _log("408"), _log("(1+1)")], meta)
    # A call: result as observation, no reward yet, not done. A plain answer: scored and done.
    assert [o["content"] for o in ret.observations][0] == "=408 "
    assert ret.rewards.tolist() == [0.0, 1.0, 0.0]
    assert ret.terminateds.tolist() == [False, True, False]
    assert ret.metadata[0]["tool_calls"] == 1
    # Second turn: the answer after the call is scored; a second call is over the limit and is an answer (wrong).
    ret2 = env.step([_log("(12*34)", "408"), _log("(1+1)", "(1+1)")], [ret.metadata[0], ret.metadata[2]])
    assert ret2.rewards.tolist() == [1.0, 0.0]
    assert ret2.terminateds.tolist() == [True, True]


def test_answer_cut_at_eos_text():
    env = CalculatorEnv()
    ret = env.step([_log("408<eos><pad>")], [{"ground_truth": "408"}])
    assert ret.rewards.tolist() == [1.0]


def test_warmup_examples_from_the_demonstration():
    tok = build_char_tokenizer()
    d = make_prompt_datum("12*34=", "408", tok, idx=0, task_name="calculator")
    examples = warmup_examples(d, tok, CalculatorEnv())
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    eos = tok.eos_token_id
    assert examples == [
        (d.prompt_token_ids, ids("(12*34)")),  # the call ends at the ")" stop string, no eos
        (d.prompt_token_ids + ids("(12*34)") + ids("=408 "), ids("408") + [eos]),
    ]
    # An environment without a demonstration: the single-turn (prompt, answer + eos) example.
    assert warmup_examples(d, tok, ArithmeticEnv()) == [(d.prompt_token_ids, ids("408") + [eos])]


@pytest.mark.parametrize("prompt", ["not an expression", "12/34="])
def test_no_demonstration_for_other_prompts(prompt):
    assert CalculatorEnv().demonstration(prompt, {}) is None
