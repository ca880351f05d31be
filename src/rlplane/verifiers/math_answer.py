"""Scoring a free-form math answer against a reference with Hugging Face ``math-verify``.

As NeMo RL's math environment: the reference is wrapped as ``\\boxed{...}`` (unless it already
holds a box) and parsed as LaTeX; the prediction is parsed from the whole response with both
LaTeX (a ``\\boxed{}`` answer takes priority) and plain-expression extraction, and the two are
compared symbolically (``\\boxed{1/2}`` equals ``0.5``; ``\\{2,1\\}`` equals ``\\{1,2\\}``).

math-verify's own timeouts are turned off here (``parsing_timeout=None``, ``timeout_seconds=None``):
they rely on ``signal.alarm``, which raises outside the main thread. Run this under
``rlplane.verifiers.pool.VerifierPool`` for a deadline that works anywhere.
"""

from __future__ import annotations

import logging

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

# math-verify warns on every call that its timeout is off; the pool enforces one.
logging.getLogger("math_verify").setLevel(logging.ERROR)

_GOLD_CONFIG = [LatexExtractionConfig()]
_PRED_CONFIG = [ExprExtractionConfig(), LatexExtractionConfig()]


def boxed_reference(ground_truth: str) -> str:
    """The reference as math-verify's gold: ``\\boxed{gt}`` unless it already has a ``\\boxed``."""
    gt = str(ground_truth).strip()
    return gt if "\\boxed" in gt else "\\boxed{" + gt + "}"


def verify_math_answer(response: str, ground_truth: str) -> tuple[float, str | None]:
    """``(score, extracted answer)``: 1.0 if the response's answer equals the reference, else 0.0.

    Malformed LaTeX or an answer that cannot be parsed scores 0.0 (never raises).
    """
    try:
        gold = parse(boxed_reference(ground_truth), extraction_config=_GOLD_CONFIG, parsing_timeout=None)
        pred = parse(str(response), extraction_config=_PRED_CONFIG, parsing_timeout=None)
        if not gold or not pred:
            return 0.0, (str(pred[-1]) if pred else None)
        ok = verify(gold, pred, timeout_seconds=None)
        return (1.0 if ok else 0.0), str(pred[-1])
    except Exception:  # math-verify and sympy raise many kinds on malformed input
        return 0.0, None
