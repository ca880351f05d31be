"""DAPO's rule-based math check (verl's ``math_dapo``, NeMo RL's ``math_verify_impl: dapo_math_verify``).

Only the response's last 300 characters count. The answer is what follows the last ``Answer:`` (any case) up to
the end of its line; answer and reference are normalised the Minerva way (the part after the last ``=``, units,
``\\text{}``, ``\\boxed{}``, ``$`` and spaces dropped, ``\\fracab`` and ``\\sqrta`` braced, a comma-grouped integer
joined) and must then be equal as text. 1.0 or 0.0; a response without ``Answer:`` scores 0.
"""

from __future__ import annotations

import re

TAIL_CHARS = 300
_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
# (text, replacement), in order, then words and LaTeX bits removed: Minerva's normalisation.
_REPLACE = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""), ("mbox", "text"),
            (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
_DROP = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
         "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges",
         "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2",
         "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"',
         "\\dots")
_UNWRAP = (r"(\\text\{)(.*?)(\})", r"(\\textbf\{)(.*?)(\})", r"(\\overline\{)(.*?)(\})", r"(\\boxed\{)(.*)(\})")


def normalize_answer(text: str) -> str:
    """A final answer in the comparable form described in the module docstring."""
    text = text.split("=")[-1]
    for old, new in _REPLACE:
        text = text.replace(old, new)
    for word in _DROP:
        text = text.replace(word, "")
    text = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", text)  # the first $...$ span only
    for pattern in _UNWRAP:
        text = re.sub(pattern, "\\2", text)
    text = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", text)
    text = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def verify_dapo_answer(response: str, ground_truth: str) -> tuple[float, str]:
    """``(score, normalised answer)`` of ``response`` against ``ground_truth`` (``[INVALID]`` without one)."""
    found = _ANSWER.findall(str(response)[-TAIL_CHARS:])
    pred = normalize_answer(found[-1] if found else "[INVALID]")
    return (1.0 if pred == normalize_answer(str(ground_truth)) else 0.0), pred
