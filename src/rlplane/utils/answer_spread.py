"""How spread out a policy's answers are, against what one constant answer would score.

A small policy under RL can raise its held-out accuracy without learning the task: it answers the same
thing to every problem (letter counting: "1" to all, right on half of them). These two numbers make that
visible on every validation: ``top_answer_share``, the share of the greedy replies that end on their
commonest answer (1.0 = one answer for everything), and ``constant_answer_accuracy``, the accuracy of always
giving the commonest reference answer (the floor such a collapse reaches). An accuracy near the second with a
share near 1 is a collapse, not learning. A rule that depends on the problem (answer the larger number) keeps
the share low and is not caught here.
"""

from __future__ import annotations

import re
from collections import Counter

_ANSWER_IS = re.compile(r"answer is", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_WRAPPERS = "\"'`*$ "


def final_answer(reply: str) -> str:
    """The answer a reply ends on, normalized for counting: after the last "answer is" on the last non-empty
    line, else that line's last number, else the whole line; quotes and a final period dropped, lowercased.
    ``"The LCM of 6 and 10 is 30."`` -> ``"30"``, ``"The answer is: Dan."`` -> ``"dan"``."""
    lines = [line.strip() for line in reply.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    last = lines[-1]
    marked = _ANSWER_IS.split(last)
    if len(marked) > 1:
        value = marked[-1].lstrip(": \t")
    else:
        numbers = _NUMBER.findall(last)
        value = numbers[-1] if numbers else last
    return normalize_answer(value)


def normalize_answer(text) -> str:
    """``text`` as :func:`final_answer` leaves an answer: stripped, quotes and a final period dropped, lowercased."""
    return str(text).strip().rstrip(".").strip(_WRAPPERS).rstrip(".").lower()


def top_answer_share(replies: list[str]) -> float:
    """The share of ``replies`` whose :func:`final_answer` is the commonest one (0.0 for no replies)."""
    if not replies:
        return 0.0
    return Counter(final_answer(r) for r in replies).most_common(1)[0][1] / len(replies)


def constant_answer_accuracy(references: list) -> tuple[float, str]:
    """``(accuracy, answer)`` of always giving the commonest of the reference answers (compared as stripped
    text, so ``7`` and ``"7 "`` are one answer). ``(0.0, "")`` for none."""
    if not references:
        return 0.0, ""
    answer, count = Counter(str(r).strip() for r in references).most_common(1)[0]
    return count / len(references), answer
