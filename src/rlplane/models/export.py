"""Exporting a LoRA run's checkpoint as one merged Hugging Face model directory."""

from __future__ import annotations

import os
from typing import Any

from rlplane.models.configured import load_configured_policy
from rlplane.models.lora import load_policy_weights


def export_merged(checkpoint: str, output: str, policy: Any, seed: int) -> None:
    """Write the merged model of the LoRA ``step_N`` checkpoint to ``output`` as a plain HF directory; ``policy``
    and ``seed`` (the checkpoint's config) name the base model."""
    model, tokenizer = load_configured_policy(policy, seed, trainable=True)
    load_policy_weights(model, os.path.join(checkpoint, "policy", "weights"))
    merged = model.merge_and_unload()
    merged.save_pretrained(output, safe_serialization=True)
    tokenizer.save_pretrained(output)
