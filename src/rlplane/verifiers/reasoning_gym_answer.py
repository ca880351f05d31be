"""Scoring a response to a reasoning-gym problem with that task's own ``score_answer``."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import reasoning_gym

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# "... the final answer is -129." (instruct models that ignore the \boxed{} instruction)
_ANSWER_IS = re.compile(r"answer is[:\s]*\$?([^\n$]*?)\$?\s*\.?\s*$", re.IGNORECASE | re.MULTILINE)


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start == -1:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None  # unbalanced: the box never closes


# answer_format: "any" takes the first found of extract_answer's chain; the others only the format asked for;
# "lenient" reads a marked answer like "any" (quotes and a final period dropped), else tries answer_candidates.
ANSWER_FORMATS = ("any", "boxed", "answer_tag", "lenient")
# The value a sentence ends on: "The GCD of 3 and 5 is 1." -> "1", "12 = 2 × 2 × 3" -> "2 × 2 × 3".
_TAIL_VALUE = re.compile(r"(?:\bis|=|:)\s+([^=:]*?)\s*$", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_WRAPPERS = "\"'`*"


def _clean(value: str) -> str:
    """``value`` without a final period and without wrapping quotes, backticks or bold marks."""
    value = value.strip().rstrip(".").strip()
    while len(value) > 1 and value[0] == value[-1] and value[0] in _WRAPPERS:
        value = value[1:-1].strip().rstrip(".").strip()
    return value


def answer_candidates(response: str) -> list[str]:
    """Answers a ``lenient`` reading scores (the best one counts): the marked answer alone when the response
    has one (box, tag, "answer is X"); else from its last line: the line, the value it ends on after
    "is" / "=" / ":", and its last number. A few readings of one line, so listing many guesses gains nothing."""
    marked = extract_answer(response, "any")
    lines = [line.strip() for line in response.strip().splitlines() if line.strip()]
    if marked is None or not lines:
        return []
    if marked != lines[-1] or _ANSWER_IS.search(lines[-1]):  # a box, a tag or an "answer is" line
        return [_clean(marked) or marked]
    last = lines[-1]
    found = [_clean(last)]
    tail = _TAIL_VALUE.search(last.rstrip(". "))
    if tail:
        found.append(_clean(tail.group(1)))
    numbers = _NUMBER.findall(last)
    if numbers:
        found.append(numbers[-1])
    return [c for i, c in enumerate(found) if c and c not in found[:i]]


def extract_answer(response: str, answer_format: str = "any") -> str | None:
    """The last ``\\boxed{}``, else ``<answer>`` tag, else "answer is X" at a line end, else the last non-empty
    line; ``answer_format="boxed"`` / ``"answer_tag"`` accept only that format (else None)."""
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format {answer_format!r}: use one of {', '.join(ANSWER_FORMATS)}")
    if answer_format == "lenient":
        candidates = answer_candidates(response)
        return candidates[0] if candidates else None
    if answer_format == "boxed":
        boxed = last_boxed(response)
        return None if boxed is None else boxed.strip()
    if answer_format == "answer_tag":
        found = _ANSWER_TAG.findall(response)
        return found[-1].strip() if found else None
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed.strip()
    for pattern in (_ANSWER_TAG, _ANSWER_IS):
        found = [m.strip() for m in pattern.findall(response) if m.strip()]
        if found:
            return found[-1]
    lines = [line.strip() for line in response.strip().splitlines() if line.strip()]
    return lines[-1] if lines else None


@lru_cache(maxsize=None)
def _scorer(name: str):
    return reasoning_gym.get_score_answer_fn(name)


def score_reasoning_gym_answer(
    response: str, entry: dict[str, Any], partial_credit: bool = True, answer_format: str = "any"
) -> tuple[float, str | None]:
    """``(score in [0, 1], extracted answer)`` by the task in ``entry["metadata"]["source_dataset"]``.

    Without ``partial_credit`` only a fully correct answer scores (reasoning-gym's default gives ``"16."``
    2/3 against ``16``, so a mean reward would read as more than accuracy). ``lenient``: the best of
    ``answer_candidates``."""
    if answer_format == "lenient":
        scored = [_score(c, entry, partial_credit) for c in answer_candidates(response)]
        return max(scored, key=lambda s: s[0], default=(0.0, None))
    answer = extract_answer(response, answer_format)
    return (0.0, None) if answer is None else _score(answer, entry, partial_credit)


def _score(answer: str, entry: dict[str, Any], partial_credit: bool) -> tuple[float, str]:
    try:
        score = float(_scorer(entry["metadata"]["source_dataset"])(answer, entry))
    except Exception:
        return 0.0, answer
    if not partial_credit:
        score = 1.0 if score >= 1.0 else 0.0
    return score, answer
