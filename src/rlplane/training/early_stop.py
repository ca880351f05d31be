"""Ending a run on its validations: NeMo RL's threshold (``stop_at_validation_metric`` >= ``_threshold``) and
``early_stop``'s plateau (no new best by ``min_delta`` in ``patience`` validations) or drop (below best -
``max_drop``) rules. Every validation counts, the first included; the state rides in checkpoints."""

from __future__ import annotations

import math

from rlplane.config.loops import EarlyStopConfig, RolloutLoopConfig

PREFIX = "validation/"


def _value(metrics: dict, name: str) -> float | None:
    key = name if name.startswith(PREFIX) else PREFIX + name
    v = metrics.get(key)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


class EarlyStop:
    """``observe`` each validation's metrics; it returns why the run should stop now, or None."""

    def __init__(self, loop: RolloutLoopConfig, options: EarlyStopConfig):
        self.threshold_metric, self.threshold = loop.stop_at_validation_metric, loop.stop_at_validation_threshold
        self.options = options
        self.best: float | None = None
        self.since_best = 0  # validations in a row without a new best

    def observe(self, metrics: dict) -> str | None:
        if self.threshold_metric is not None:
            v = _value(metrics, self.threshold_metric)
            if v is not None and v >= self.threshold:
                return (f"validation {self.threshold_metric} {v:.4g} reached "
                        f"stop_at_validation_threshold {self.threshold:g}")
        o = self.options
        if not o.enabled or (v := _value(metrics, o.metric)) is None:
            return None
        if self.best is None or v > self.best + o.min_delta:
            self.best, self.since_best = v, 0
            return None
        self.since_best += 1
        if o.max_drop is not None and v < self.best - o.max_drop:
            return (f"early stop: validation {o.metric} {v:.4g} fell more than max_drop {o.max_drop:g} "
                    f"below the best {self.best:.4g}")
        if self.since_best >= o.patience:
            return (f"early stop: validation {o.metric} has not bettered {self.best:.4g} by more than min_delta "
                    f"{o.min_delta:g} in {self.since_best} validations (patience {o.patience})")
        return None

    def state(self) -> dict:
        return {"best": self.best, "since_best": self.since_best}

    def load_state(self, state: dict | None) -> None:
        if state:
            self.best, self.since_best = state.get("best"), int(state.get("since_best", 0))
