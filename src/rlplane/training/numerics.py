"""The run's numerics settled once: ``policy.precision: auto`` becomes the concrete choice, so config.yaml,
every checkpoint and every worker see one value, and a resumed run keeps the one its checkpoint recorded
(a resume on another machine does not switch a bf16 run to fp32 halfway)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from rlplane.config.schema import RunConfig
from rlplane.models.precision import PRECISIONS


@dataclass(frozen=True)
class Numerics:
    """``precision`` the models compute in (``auto`` only where each GPU worker decides for its own device) and
    ``why``; ``device`` the trained ranks compute on."""

    precision: str
    why: str
    device: str


def numerics(cfg: RunConfig, resumed: Path | None = None) -> Numerics:
    """``policy.precision`` settled for the run: as set; for ``auto`` on CPU the choice a resumed run recorded, else
    what this host's features and the model's width give (the model's config is read, not its weights); for
    ``auto`` on a GPU each worker decides for its own device."""
    from rlplane.models.configured import configured_architecture
    from rlplane.models.precision import choose_precision

    p = cfg.policy
    if p.precision != "auto":
        return Numerics(p.precision, "set in the config", p.device)
    if p.device != "cpu":
        return Numerics("auto", "each GPU worker decides for its device", p.device)
    saved = recorded_precision(resumed)
    if saved is not None:
        return Numerics(saved, f"auto: recorded by the run that wrote {resumed}", p.device)
    chosen, why = choose_precision("auto", getattr(configured_architecture(p), "hidden_size", None), "cpu")
    return Numerics(chosen, f"auto: {why}", p.device)


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


def settle_precision(cfg: RunConfig, chosen: str) -> RunConfig:
    """``cfg`` with ``policy.precision: auto`` replaced by ``chosen``, what the policy model got on this host."""
    return _with_precision(cfg, chosen) if _on_cpu_auto(cfg) else cfg
