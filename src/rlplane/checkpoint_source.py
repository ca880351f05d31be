"""Where a checkpoint's policy weights are: a run directory (its latest complete checkpoint), a ``step_N``
checkpoint or a Hugging Face model directory, for ``rlplane eval``, ``rlplane export`` and the Python API. A path
that holds none is one line; torch is imported only once the path is a directory."""

from __future__ import annotations


def checkpoint_weights(path: str):
    """``(weights dir, checkpoint dir or None)`` of a run directory, a ``step_N`` checkpoint or an HF directory."""
    from pathlib import Path

    from rlplane.errors import ConfigError

    p = Path(path)
    if not p.is_dir():
        what = "is a file, not a directory" if p.exists() else "no such directory"
        raise ConfigError([f"--checkpoint {p}: {what}; pass a run directory, "
                           "a step_N checkpoint or an HF model directory"])
    from rlplane.utils.checkpoint import CheckpointManager, weight_shapes

    ckpt = p
    if (p / "checkpoints").is_dir():  # a run directory: its latest complete checkpoint
        ckpt = CheckpointManager(p / "checkpoints", None, "val:accuracy", True).latest() or p
    weights = ckpt / "policy" / "weights"
    if weights.is_dir() and (weights / "adapter_config.json").is_file():
        return weights, ckpt  # a LoRA adapter (policy.lora.enabled): export merges it into its base model
    if weights.is_dir() and (weights / "config.json").is_file():
        weight_shapes(weights)  # a damaged or truncated file: one line now, not a traceback in the loader
        return weights, ckpt
    if (p / "config.json").is_file():
        weight_shapes(p)
        return p, None
    raise ConfigError([f"--checkpoint {p}: no model there (expected checkpoints/step_N/policy/weights, "
                       "policy/weights or config.json); pass a run directory, "
                       "a step_N checkpoint or an HF model directory"])
