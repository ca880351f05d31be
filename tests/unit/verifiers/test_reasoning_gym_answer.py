"""reasoning-gym scoring: answer extraction and the exact (no partial credit) switch."""

from __future__ import annotations

import pytest

pytest.importorskip("reasoning_gym")

from rlplane.verifiers.reasoning_gym_answer import score_reasoning_gym_answer  # noqa: E402

# A basic_arithmetic entry as reasoning-gym stores it: the oracle answer is the string "16".
ENTRY = {"question": "Calculate 6 + 10.", "answer": "16", "metadata": {"source_dataset": "basic_arithmetic"}}


def test_answer_is_line_is_extracted_and_scored_exactly():
    assert score_reasoning_gym_answer("6 + 10 = 16.\nThe answer is 16.", ENTRY, partial_credit=False) == (1.0, "16")
    assert score_reasoning_gym_answer("The answer is 15.", ENTRY, partial_credit=False) == (0.0, "15")


def test_partial_credit_is_kept_by_default_and_dropped_when_exact():
    # The last line "16 apples" contains the oracle "16": reasoning-gym's default score_answer gives
    # len("16") / len("16 apples") = 2 / 9; exact scoring makes it 0.
    score, answer = score_reasoning_gym_answer("16 apples", ENTRY)
    assert answer == "16 apples" and score == pytest.approx(2 / 9)
    assert score_reasoning_gym_answer("16 apples", ENTRY, partial_credit=False) == (0.0, "16 apples")


def test_strict_boxed_format_scores_only_a_boxed_answer():
    # Strict: the right number outside \boxed{} is no answer at all (None, 0); inside it scores 1.
    assert score_reasoning_gym_answer("The answer is 16.", ENTRY, False, "boxed") == (0.0, None)
    assert score_reasoning_gym_answer("6 + 10 = 16, so \\boxed{16}", ENTRY, False, "boxed") == (1.0, "16")
    # The last box counts, as in the default chain: "\boxed{15} ... \boxed{16}" reads 16.
    assert score_reasoning_gym_answer("\\boxed{15} no, \\boxed{16}", ENTRY, False, "boxed") == (1.0, "16")
    # Without the strict format the same unboxed reply is read from its "answer is" line.
    assert score_reasoning_gym_answer("The answer is 16.", ENTRY, False) == (1.0, "16")


def test_strict_answer_tag_format_scores_only_a_tagged_answer():
    assert score_reasoning_gym_answer("16", ENTRY, False, "answer_tag") == (0.0, None)
    assert score_reasoning_gym_answer("<answer> 16 </answer>", ENTRY, False, "answer_tag") == (1.0, "16")
    # A box does not stand in for the tag.
    assert score_reasoning_gym_answer("\\boxed{16}", ENTRY, False, "answer_tag") == (0.0, None)


def test_unknown_answer_format_is_refused():
    with pytest.raises(ValueError, match="answer_format 'xml': use one of any, boxed, answer_tag"):
        score_reasoning_gym_answer("16", ENTRY, False, "xml")


GCD = {"question": "Find the GCD of 3, 5.", "answer": "1", "metadata": {"source_dataset": "gcd"}}


def test_lenient_reads_the_value_a_sentence_ends_on():
    # No "answer is" marker: the default reads the whole last line, which the exact scorer refuses.
    assert score_reasoning_gym_answer("The GCD of 3 and 5 is 1.", GCD, False) == (0.0, "The GCD of 3 and 5 is 1.")
    assert score_reasoning_gym_answer("The GCD of 3 and 5 is 1.", GCD, False, "lenient") == (1.0, "1")
    assert score_reasoning_gym_answer("6 + 10 = 16", ENTRY, False, "lenient") == (1.0, "16")
    assert score_reasoning_gym_answer("It appears 16 times in the text.", ENTRY, False, "lenient") == (1.0, "16")
    assert score_reasoning_gym_answer("The GCD of 3 and 5 is 3.", GCD, False, "lenient")[0] == 0.0


def test_lenient_drops_quotes_and_a_final_period_of_a_marked_answer():
    entry = {"question": "Spell backward: ab", "answer": "ba", "metadata": {"source_dataset": "spell_backward"}}
    assert score_reasoning_gym_answer('The answer is "ba."', entry, False) == (0.0, '"ba."')
    assert score_reasoning_gym_answer('The answer is "ba."', entry, False, "lenient") == (1.0, "ba")


def test_lenient_takes_a_marked_answer_alone():
    # A wrong marked answer is not rescued by a right number elsewhere, nor by a later line's number.
    assert score_reasoning_gym_answer("1 and 5... The answer is 5.", GCD, False, "lenient") == (0.0, "5")
    assert score_reasoning_gym_answer("The answer is 5.\nSo 1 it is, or 1", GCD, False, "lenient") == (0.0, "5")
    assert score_reasoning_gym_answer("\\boxed{5} is 1", GCD, False, "lenient") == (0.0, "5")


def test_lenient_reads_only_the_last_line():
    assert score_reasoning_gym_answer("The GCD is 1.\nI am not sure.", GCD, False, "lenient") == (0.0, "I am not sure")
    assert score_reasoning_gym_answer("", GCD, False, "lenient") == (0.0, None)
