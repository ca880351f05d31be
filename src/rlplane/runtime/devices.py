"""Which device a worker computes on, and how tensors get there.

``policy.device`` is resolved once per worker process (under Ray inside the actor, where ``cuda`` is the
GPU Ray gave it); the process group's backend follows it. The data plane stores host tensors.
"""

from __future__ import annotations

import torch

from rlplane.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> torch.device:
    """``policy.device`` → this process's device: ``auto`` is CUDA when a GPU is visible; ``cuda`` needs one."""
    if name not in DEVICES:
        raise ConfigError([f"policy.device = {name!r}: must be one of {', '.join(DEVICES)}"])
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError([
                "policy.device = cuda but this process sees no GPU (torch.cuda.is_available() is False); "
                "set policy.device=cpu or auto, or give the workers a GPU (cluster.gpus_per_node)"
            ])
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def dist_backend(device: torch.device) -> str:
    """The process-group backend for ranks on ``device``: NCCL between GPUs, gloo on CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """``batch`` on ``device``; on CUDA pinned, non-blocking copies (stream-ordered, no sync needed)."""
    if device.type != "cuda":
        return {k: v.to(device) for k, v in batch.items()}
    return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}


def num_gpus_per_worker(device: str, cluster_gpus: float) -> float:
    """GPUs a trainable worker's Ray actor asks for, decided on the driver: one when it will compute on CUDA."""
    return 1.0 if device == "cuda" or (device == "auto" and cluster_gpus > 0) else 0.0


def gpu_requests(gpus_per_rank: float, colocated: bool, teacher: bool = False, tensor_parallel: int = 1
                 ) -> dict[str, float]:
    """The GPUs each Ray actor asks for when a trainable rank computes on ``gpus_per_rank`` (0: on CPU).

    Rank ``i``'s GPU is split evenly among the actors that share it, so Ray gives them all the same device:
    policy rank ``i``, a frozen teacher's rank ``i``, and colocated generator ``i`` (asleep while the policy
    trains). A split generator gets GPUs of its own (``tensor_parallel`` for a vLLM engine); a critic rank
    keeps a whole GPU (it trains beside the policy)."""
    if not gpus_per_rank:
        return {"policy": 0.0, "value": 0.0, "teacher": 0.0, "generator": 0.0}
    share = gpus_per_rank / (1 + colocated + teacher)
    return {"policy": share, "value": gpus_per_rank, "teacher": share if teacher else 0.0,
            "generator": share if colocated else float(tensor_parallel)}


def check_cluster_gpus(device: str, num_workers: int, cluster_gpus: float) -> None:
    """``policy.device = cuda`` needs a GPU per worker (an actor asking for a missing GPU waits forever)."""
    if device == "cuda" and cluster_gpus < num_workers:
        raise ConfigError([
            f"policy.device = cuda needs {num_workers} GPU(s) (one per trainable worker) but the Ray cluster has "
            f"{cluster_gpus:g}; set cluster.gpus_per_node, lower policy.dp_size, or set policy.device=auto/cpu"
        ])


def seeded_generator(device: torch.device, seed: int) -> torch.Generator:
    """A ``torch.Generator`` on ``device`` (sampling from CUDA probabilities needs a CUDA generator)."""
    return torch.Generator(device=device).manual_seed(seed)
