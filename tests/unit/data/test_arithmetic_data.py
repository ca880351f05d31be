"""Procedural arithmetic: deterministic, correct answers, disjoint eval split, prompt tokens."""

import numpy as np
import pytest

from rlplane.data import ArithmeticDataset, ArithmeticSpec, DatasetError, build_eval_set, is_heldout
from rlplane.data.arithmetic import digit_bands, draw_problem, solve
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


@pytest.mark.parametrize(
    "lo, hi, bands",
    [
        (0, 99, [(0, 9), (10, 99)]),
        (5, 1234, [(5, 9), (10, 99), (100, 999), (1000, 1234)]),
        (10, 99, [(10, 99)]),
        (7, 7, [(7, 7)]),
        (0, 0, [(0, 0)]),
        (9, 10, [(9, 9), (10, 10)]),
    ],
)
def test_digit_bands_cut_where_the_digit_count_changes(lo, hi, bands):
    assert digit_bands(lo, hi) == bands


@pytest.mark.parametrize("lo, hi", [(0, 99), (3, 250), (10, 99), (0, 9)])
def test_all_by_digits_draws_each_digit_count_equally_in_range(tok, lo, hi):
    spec = ArithmeticSpec(operand_min=lo, operand_max=hi, by_digits_share=1.0, eval_fraction=0.2)
    ds = ArithmeticDataset(tok, spec, num_problems=4000, seed=1)
    counts: dict[int, int] = {}
    for i in range(len(ds)):
        problem, answer = ds.problem(i)
        a, _, b = _parse(problem)
        assert lo <= a <= hi and lo <= b <= hi and answer == str(a + b)
        counts[len(str(a))] = counts.get(len(str(a)), 0) + 1
    # One band per digit count in [lo, hi], each drawn 4000 / bands times in expectation (binomial sd <= 32):
    # 0..99 gives one-digit operands ~2000 times where uniform draws give ~400.
    assert set(counts) == {len(str(x)) for x in range(lo, hi + 1)}
    expected = len(ds) / len(counts)
    assert all(abs(c - expected) < 200 for c in counts.values()), counts


@pytest.mark.parametrize("share, one_digit_rate", [(0.0, 0.1), (0.25, 0.2), (0.5, 0.3), (1.0, 0.5)])
def test_by_digits_share_mixes_the_two_draws(tok, share, one_digit_rate):
    # P(one digit) = share * 1/2 (its band, of two) + (1 - share) * 10/100: 0.5 -> 0.25 + 0.05 = 0.3.
    ds = ArithmeticDataset(tok, ArithmeticSpec(by_digits_share=share), num_problems=4000, seed=2)
    a_operands = [_parse(ds.problem(i)[0])[0] for i in range(len(ds))]
    rate = sum(a < 10 for a in a_operands) / len(a_operands)
    assert abs(rate - one_digit_rate) < 0.03  # binomial sd <= 0.008


def test_share_zero_draws_what_uniform_sampling_drew():
    # The stream of a share of 0 is the plain uniform draw, number for number (earlier runs replay exactly).
    rng, ref = np.random.default_rng([3, 0]), np.random.default_rng([3, 0])
    for _ in range(50):
        problem, _ = draw_problem(rng, ArithmeticSpec(by_digits_share=0.0), "any")
        a, b = (int(x) for x in ref.integers(0, 100, size=2))
        assert problem == f"{a}+{b}="


def test_by_digits_changes_training_problems_only(tok):
    uniform, by_digits = ArithmeticSpec(), ArithmeticSpec(by_digits_share=1.0)
    assert ([d.extra_env_info for d in build_eval_set(tok, uniform, num_problems=300)]
            == [d.extra_env_info for d in build_eval_set(tok, by_digits, num_problems=300)])
    # The large-space branch (rejection sampling) keeps held-out problems uniform too.
    wide, wide_digits = ArithmeticSpec(operand_max=2000), ArithmeticSpec(operand_max=2000, by_digits_share=1.0)
    assert ([d.extra_env_info for d in build_eval_set(tok, wide, num_problems=50)]
            == [d.extra_env_info for d in build_eval_set(tok, wide_digits, num_problems=50)])


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
        ({"by_digits_share": 1.5}, "by_digits_share = 1.5: must be in"),
        ({"by_digits_share": -0.1}, "by_digits_share = -0.1: must be in"),
    ],
)
def test_spec_errors(kwargs, fragment):
    with pytest.raises(DatasetError, match=fragment):
        ArithmeticSpec(**kwargs)


def test_overlong_procedural_prompt_errors(tok):
    ds = ArithmeticDataset(tok, ArithmeticSpec(num_digits=3), num_problems=10, max_prompt_length=4)
    with pytest.raises(DatasetError, match="over max_prompt_length = 4"):
        ds[0]


def test_the_config_key_reaches_the_training_draws_and_leaves_the_held_out_set(tok):
    from rlplane.config.loading import load_config
    from rlplane.datasets import build_datasets

    def built(*overrides):
        o = load_config(None, ["grpo.num_prompts_per_step=200", "policy.train_global_batch_size=1600",
                               "policy.train_micro_batch_size=200", "policy.logprob_batch_size=200",
                               "grpo.max_val_samples=100", *overrides]).dataset_options()
        loader, val, _ = build_datasets(o, tok)
        first = [_parse(d.message_log[0]["content"])[0] for d in next(iter(loader))]
        return sum(a < 10 for a in first) / len(first), [d.extra_env_info for d in val]

    uniform_rate, uniform_val = built()
    digits_rate, digits_val = built("data.arithmetic.by_digits_share=1.0")
    assert uniform_rate < 0.2 < 0.35 < digits_rate  # expected 0.1 and 0.5 of 200 draws (sd 0.02 and 0.035)
    assert digits_val == uniform_val


@pytest.mark.parametrize(
    "lo, hi, a, op, b, text",
    [
        (0, 99, 7, "+", 42, "07+42="),  # width of 99: 2
        (0, 99, 7, "+", 5, "07+05="),
        (0, 99, 10, "*", 99, "10*99="),  # already two digits: unchanged
        (3, 1234, 5, "-", 3, "0005-0003="),  # width of 1234: 4
        (0, 9, 7, "+", 2, "7+2="),  # one-digit range: nothing to pad
    ],
)
def test_padded_operands_take_the_width_of_the_largest(lo, hi, a, op, b, text):
    assert ArithmeticSpec(operand_min=lo, operand_max=hi, pad_operands=True).text(a, op, b) == text
    assert ArithmeticSpec(operand_min=lo, operand_max=hi).text(a, op, b) == f"{a}{op}{b}="


def test_padding_reaches_training_and_held_out_problems_and_leaves_answers_alone(tok):
    spec = ArithmeticSpec(operators=("+", "-"), pad_operands=True)
    ds = ArithmeticDataset(tok, spec, num_problems=300, seed=3)
    problems = [ds.problem(i) for i in range(300)] + [
        (d.message_log[0]["content"], d.extra_env_info["ground_truth"]) for d in build_eval_set(tok, spec)]
    for problem, answer in problems:
        a, op, b = _parse(problem)
        assert problem == f"{a:02d}{op}{b:02d}=" and len(problem) == 6
        assert answer == str(solve(a, op, b))  # "07+05=" -> "12", "09-09=" -> "0": never zero-padded
    assert any(a < 10 for a, _, _ in (_parse(p) for p, _ in problems))
