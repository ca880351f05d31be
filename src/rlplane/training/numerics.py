"""The run's numerics settled once: ``policy.precision: auto`` becomes the concrete choice, so config.yaml,
every checkpoint and every worker see one value, and a resumed run keeps the one its checkpoint recorded
(a resume on another machine does not switch a bf16 run to fp32 halfway)."""

from __future__ import annotations

from pathlib import Path

import yaml

from rlplane.config.schema import RunConfig
from rlplane.models.precision import PRECISIONS


def recorded_precision(checkpoint: Path | None) -> str | None:
    """``policy.precision`` of the run that wrote ``checkpoint`` (its config.yaml), if it recorded a concrete one."""
    if checkpoint is None:
        return None
    try:
        tree = yaml.safe_load((checkpoint / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None  # the resume check reports a damaged checkpoint in its own words
    value = ((tree or {}).get("policy") or {}).get("precision") if isinstance(tree, dict) else None
    return value if value in PRECISIONS else None


def _on_cpu_auto(cfg: RunConfig) -> bool:
    # A GPU worker decides for its own device (models/precision.py); only a CPU policy's choice is the host's.
    return cfg.policy.precision == "auto" and cfg.policy.device == "cpu"


def _with_precision(cfg: RunConfig, precision: str) -> RunConfig:
    return cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"precision": precision})})


def keep_recorded_precision(cfg: RunConfig, resumed: Path | None) -> tuple[RunConfig, str | None]:
    """``(cfg, note)``: ``policy.precision: auto`` replaced by the precision ``resumed``'s run recorded (before the
    policy is loaded, so it loads that way); ``note`` says so. Unchanged when there is nothing recorded."""
    saved = recorded_precision(resumed) if _on_cpu_auto(cfg) else None
    if saved is None:
        return cfg, None
    return _with_precision(cfg, saved), f"policy.precision: auto -> {saved} (recorded by the run that wrote {resumed})"


def settle_precision(cfg: RunConfig, chosen: str) -> RunConfig:
    """``cfg`` with ``policy.precision: auto`` replaced by ``chosen``, what the policy model got on this host."""
    return _with_precision(cfg, chosen) if _on_cpu_auto(cfg) else cfg
