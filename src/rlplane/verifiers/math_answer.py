"""Scoring a free-form math answer against a reference with ``math-verify``, as NeMo RL's math environment.

The reference is parsed as ``\\boxed{...}`` LaTeX, the response with LaTeX and plain extraction, compared
symbolically. math-verify's own timeouts (``signal.alarm``, main thread only) are off: run this under
``rlplane.verifiers.pool.VerifierPool`` for a deadline.
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
    """``(score, extracted answer)``: 1.0 if the answer equals the reference, else 0.0 (never raises)."""
    try:
        gold = parse(boxed_reference(ground_truth), extraction_config=_GOLD_CONFIG, parsing_timeout=None)
        pred = parse(str(response), extraction_config=_PRED_CONFIG, parsing_timeout=None)
        if not gold or not pred:
            return 0.0, (str(pred[-1]) if pred else None)
        ok = verify(gold, pred, timeout_seconds=None)
        return (1.0 if ok else 0.0), str(pred[-1])
    except Exception:  # math-verify and sympy raise many kinds on malformed input
        return 0.0, None
