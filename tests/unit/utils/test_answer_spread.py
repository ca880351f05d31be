"""The answer-spread figures that tell a collapse onto one answer from learning the task."""

import pytest

from rlplane.utils.answer_spread import constant_answer_accuracy, final_answer, top_answer_share


@pytest.mark.parametrize("reply, answer", [
    ("The LCM of 6 and 10 is 30.", "30"),              # no "answer is": the line's last number
    ("The answer is: Dan.", "dan"),                    # after "answer is", colon and period dropped, lowercased
    ('The answer is "go, hundred".', "go, hundred"),   # quotes dropped, the comma inside kept
    ("I think so.\n\nThe answer is 1.", "1"),          # only the last non-empty line counts
    ("The answer is 12. The answer is 7", "7"),        # the last "answer is" on that line
    ("Friday", "friday"),                              # neither: the whole line
    ("   \n  ", ""),
    ("x = -3.5.", "-3.5"),
])
def test_final_answer(reply, answer):
    assert final_answer(reply) == answer


def test_top_answer_share_counts_the_same_answer_in_different_phrasing():
    replies = ["The answer is 1.", "The count is 1.", "answer is 1", "The answer is 2."]
    # "1" three times in four replies (three phrasings), "2" once: 3 / 4.
    assert top_answer_share(replies) == 0.75
    assert top_answer_share(["a", "b", "c", "d"]) == 0.25   # all different: 1 / 4
    assert top_answer_share([]) == 0.0


def test_constant_answer_accuracy_is_the_commonest_reference_share():
    # The letter-counting held-out set's shape: "1" on 52 of 100, "2" on 29, the rest spread: always "1" -> 0.52.
    refs = ["1"] * 52 + ["2"] * 29 + ["3"] * 12 + ["4"] * 5 + ["5"] * 2
    assert constant_answer_accuracy(refs) == (0.52, "1")
    assert constant_answer_accuracy([" 7", "7 ", "8"]) == (2 / 3, "7")  # compared stripped
    assert constant_answer_accuracy([]) == (0.0, "")
