"""DAPO's rule-based math check (``env.math.math_verify_impl: dapo_math_verify``) on hand-made responses: the last
``Answer:`` in the response's last 300 characters, Minerva-normalised, equal to the normalised reference."""

from __future__ import annotations

import pytest

from rlplane.envs.math_env import MathEnv
from rlplane.verifiers.dapo_answer import normalize_answer, verify_dapo_answer


@pytest.mark.parametrize("response, truth, score, pred", [
    ("Adding them. Answer: 42", "42", 1.0, "42"),
    ("first Answer: 3\nthen ANSWER : 4", "4", 1.0, "4"),  # the last one, any case
    ("Answer: x = 5", "5", 1.0, "5"),  # the part after the last "="
    ("Answer: 1,000 dollars", "1000", 1.0, "1000"),  # spaces out, "dollars" out, the comma-grouped integer joined
    ("Answer: \\frac12", "\\frac{1}{2}", 1.0, "\\frac{1}{2}"),  # \fracab braced
    ("Answer: $\\boxed{7}$", "7", 1.0, "7"),
    ("The answer is 42", "42", 0.0, "[INVALID]"),  # no "Answer:"
    ("Answer: 42" + " " * 300, "42", 0.0, "[INVALID]"),  # only the last 300 characters are read
    ("Answer: 41", "42", 0.0, "41"),
])
def test_dapo_rule(response, truth, score, pred):
    assert verify_dapo_answer(response, truth) == (score, pred)


def test_normalisation_keeps_what_it_does_not_know():
    assert normalize_answer("\\text{(A)}") == "(A)" and normalize_answer(" 3.5 ") == "3.5"


def test_math_env_takes_the_check_by_nemo_rl_name():
    env = MathEnv(num_workers=1, math_verify_impl="dapo_math_verify")
    try:
        out = env.step([[{"role": "assistant", "content": "Answer: 12"}], [{"role": "assistant", "content": "12"}]],
                       [{"ground_truth": "12"}, {"ground_truth": "12"}])
        assert out.rewards.tolist() == [1.0, 0.0]  # DAPO's rule needs "Answer:"; math-verify would take the bare 12
    finally:
        env.close()
    with pytest.raises(ValueError, match="math_verify_impl = 'other'"):
        MathEnv(math_verify_impl="other")
