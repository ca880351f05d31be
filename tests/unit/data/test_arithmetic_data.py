"""Procedural arithmetic: deterministic, correct answers, disjoint eval split, prompt tokens."""

import pytest

from rlplane.data import ArithmeticDataset, ArithmeticSpec, DatasetError, build_eval_set, is_heldout
from rlplane.data.arithmetic import solve
from rlplane.models import build_char_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _parse(problem: str):
    body = problem.rstrip("=")
    for op in "+-*":
        if op in body:
            a, b = body.split(op)
            return int(a), op, int(b)
    raise AssertionError(problem)


def test_deterministic_by_seed_and_index(tok):
    spec = ArithmeticSpec(operators=("+", "-", "*"))
    a = ArithmeticDataset(tok, spec, num_problems=100, seed=5)
    b = ArithmeticDataset(tok, spec, num_problems=100, seed=5)
    c = ArithmeticDataset(tok, spec, num_problems=100, seed=6)
    assert [a.problem(i) for i in range(100)] == [b.problem(i) for i in reversed(range(100))][::-1]
    assert [a.problem(i) for i in range(100)] != [c.problem(i) for i in range(100)]


def test_answers_correct_and_ranges(tok):
    spec = ArithmeticSpec(operators=("+", "-", "*"), operand_min=3, operand_max=12)
    ds = ArithmeticDataset(tok, spec, num_problems=300, seed=0)
    ops = set()
    for i in range(len(ds)):
        problem, answer = ds.problem(i)
        a, op, b = _parse(problem)
        ops.add(op)
        assert 3 <= a <= 12 and 3 <= b <= 12
        assert answer == str(solve(a, op, b))
        assert int(answer) >= 0  # nonnegative: subtraction operands are ordered
    assert ops == {"+", "-", "*"}


def test_num_digits_overrides_range(tok):
    ds = ArithmeticDataset(tok, ArithmeticSpec(num_digits=1, eval_fraction=0.2), num_problems=200, seed=0)
    for i in range(len(ds)):
        a, _, b = _parse(ds.problem(i)[0])
        assert 0 <= a <= 9 and 0 <= b <= 9


def test_datum_has_bos_prompt_and_ground_truth(tok):
    datum = ArithmeticDataset(tok, num_problems=10, seed=0)[3]
    problem, answer = ArithmeticDataset(tok, num_problems=10, seed=0).problem(3)
    (message,) = datum.message_log
    assert message["role"] == "user" and message["content"] == problem
    assert message["token_ids"][0] == tok.bos_token_id
    assert tok.decode(message["token_ids"], skip_special_tokens=True) == problem
    assert datum.length == len(message["token_ids"]) == len(problem) + 1
    assert datum.prompt_token_ids == message["token_ids"]
    assert datum.extra_env_info == {"ground_truth": answer}
    assert (datum.task_name, datum.idx, datum.loss_multiplier) == ("arithmetic", 3, 1.0)


def test_eval_set_disjoint_from_training_stream(tok):
    spec = ArithmeticSpec()
    eval_set = build_eval_set(tok, spec, num_problems=300)
    eval_problems = {d.message_log[0]["content"] for d in eval_set}
    assert len(eval_problems) == 300  # distinct
    assert all(is_heldout(p, spec.eval_fraction) for p in eval_problems)
    for seed in (0, 1):
        train = ArithmeticDataset(tok, spec, num_problems=5000, seed=seed)
        assert not {train.problem(i)[0] for i in range(len(train))} & eval_problems
    assert [d.extra_env_info for d in build_eval_set(tok, spec,
                                                     num_problems=300)] == [d.extra_env_info for d in eval_set]


def test_eval_set_too_small_space_is_a_clear_error(tok):
    with pytest.raises(DatasetError, match="only .* distinct held-out problems exist"):
        build_eval_set(tok, ArithmeticSpec(num_digits=1), num_problems=500)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"operators": ("/",)}, "each must be one of"),
        ({"operand_min": 10, "operand_max": 5}, "need 0 <= operand_min <= operand_max"),
        ({"num_digits": 0}, "num_digits = 0"),
        ({"eval_fraction": 0.0}, "eval_fraction = 0.0"),
    ],
)
def test_spec_errors(kwargs, fragment):
    with pytest.raises(DatasetError, match=fragment):
        ArithmeticSpec(**kwargs)


def test_overlong_procedural_prompt_errors(tok):
    ds = ArithmeticDataset(tok, ArithmeticSpec(num_digits=3), num_problems=10, max_prompt_length=4)
    with pytest.raises(DatasetError, match="over max_prompt_length = 4"):
        ds[0]
