"""Data parallelism for the trainable workers: the process group, plain DP's bucketed all-reduce, FSDP2
sharding (``policy.dtensor_cfg.enabled``), and the checkpoint layout of a sharded run.

The loss is normalised by global counts, so rank gradients are summed, never averaged (FSDP's divide
by world size is off). Runs on CPU with gloo and on GPUs with NCCL.
"""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist

from rlplane.errors import ConfigError
from rlplane.runtime.devices import dist_backend

BUCKET_BYTES = 25 * 2**20  # as torch DDP's default bucket_cap_mb
LAYOUT_FILE = "parallel.json"


# ---- process group
def init_dp_group(address: str, rank: int, world_size: int, device: torch.device):
    """Join the DP process group (NCCL between CUDA ranks, gloo on CPU); returns the WORLD group."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(dist_backend(device), init_method=f"tcp://{address}", rank=rank, world_size=world_size)
    return dist.group.WORLD


# ---- plain DP
def bucketed_all_reduce(tensors: list[torch.Tensor], group=None, bucket_bytes: int = BUCKET_BYTES) -> None:
    """Sum ``tensors`` across ``group`` in place, packed in order into flat buffers of at most ``bucket_bytes``
    per dtype and device run (a few collectives instead of one per parameter)."""
    bucket: list[torch.Tensor] = []
    size = 0

    def flush() -> None:
        nonlocal bucket, size
        if not bucket:
            return
        flat = torch.cat([t.reshape(-1) for t in bucket])  # (Σ numel,)
        dist.all_reduce(flat, group=group)
        offset = 0
        for t in bucket:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
        bucket, size = [], 0

    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if bucket and (size + nbytes > bucket_bytes or t.dtype != bucket[0].dtype or t.device != bucket[0].device):
            flush()
        bucket.append(t)
        size += nbytes
    flush()


def sync_gradients(model: torch.nn.Module, group) -> None:
    """Sum gradients across DP ranks after a global batch's backward (plain DP; FSDP already reduce-scattered)."""
    if group is None or is_sharded(model):
        return
    bucketed_all_reduce([p.grad for p in model.parameters() if p.grad is not None], group)


# ---- FSDP2
def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def shard_model(model: torch.nn.Module, device: torch.device, world_size: int,
                cpu_offload: bool = False) -> torch.nn.Module:
    """Shard ``model`` in place with FSDP2 over the default group's ``world_size`` ranks.

    One FSDP unit per HF block (``_no_split_modules``), the root holds the rest (tied weights stay one).
    Mixed precision follows ``rlplane_autocast_dtype``: bf16 compute, fp32 reduction and AdamW state.
    ``cpu_offload``: the shards (and their gradients, so the AdamW state) live in host memory between uses
    (``CPUOffloadPolicy``; pinned where there is a GPU to copy to).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mesh = init_device_mesh(device.type, (world_size,))
    compute = getattr(model, "rlplane_autocast_dtype", None)
    mp = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32 if compute else None)
    offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if cpu_offload else OffloadPolicy()
    block_names = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in block_names:
            fully_shard(module, mesh=mesh, mp_policy=mp, offload_policy=offload)
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=offload)
    # Rank gradients must be summed: a plain SUM reduce-scatter (factor 1), which gloo also has (unlike PREMUL_SUM).
    for module in model.modules():
        if is_sharded(module):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return model


def rebuild_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler):
    """A fresh optimizer and LambdaLR like the given ones over the (now sharded) parameters."""
    import inspect

    accepted = inspect.signature(type(optimizer).__init__).parameters
    new_opt = type(optimizer)(model.parameters(), **{k: v for k, v in optimizer.defaults.items() if k in accepted})
    new_sch = torch.optim.lr_scheduler.LambdaLR(new_opt, scheduler.lr_lambdas)
    return new_opt, new_sch


def as_float(x: torch.Tensor) -> torch.Tensor:
    """A replicated DTensor (e.g. FSDP's total grad norm) as a plain local tensor; others unchanged."""
    from torch.distributed.tensor import DTensor

    return x.full_tensor() if isinstance(x, DTensor) else x


def extra_forward_rounds(num_local: int, model: torch.nn.Module, group, device: torch.device) -> int:
    """No-op forwards this rank must add so all ranks run as many (an FSDP forward is a collective); 0 for plain DP."""
    if group is None or not is_sharded(model):
        return 0
    most = torch.tensor([num_local], device=device)
    dist.all_reduce(most, op=dist.ReduceOp.MAX, group=group)
    return int(most) - num_local


def noop_forward(model: torch.nn.Module, device: torch.device) -> None:
    """One forward on a single token, output discarded: this rank's part of the others' all-gathers."""
    with torch.no_grad():
        model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device))


def local_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of parameters and optimizer state this rank holds (local shards under FSDP)."""

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    params = sum(local(p).numel() * p.element_size() for p in model.parameters())
    state = sum(
        local(v).numel() * v.element_size()
        for s in optimizer.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0  # the step counter is a 0-dim scalar per parameter
    )
    return {"param_bytes": params, "optimizer_bytes": state}


# ---- weights and checkpoints
def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights on the host; under FSDP a collective: rank 0 gets them, others ``{}``."""
    if not is_sharded(model):
        return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor], strict: bool = True):
    """Load whole weights into ``model``; under FSDP every rank passes the same ``state`` and keeps its shard."""
    if not is_sharded(model):
        return model.load_state_dict(state, strict=strict)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    return set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=strict))


def save_sharded_state(path: str, model: torch.nn.Module, optimizer, frozen: dict[str, torch.nn.Module]) -> None:
    """Each rank writes its optimizer (and ``frozen`` weights) shard under ``path/sharded`` with
    ``torch.distributed.checkpoint``; rank 0 writes ``parallel.json``. A collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    state.update({name: get_model_state_dict(m) for name, m in frozen.items()})
    dcp.save(state, checkpoint_id=os.path.join(path, "sharded"))
    if dist.get_rank() == 0:
        with open(os.path.join(path, LAYOUT_FILE), "w") as f:
            json.dump({"world_size": dist.get_world_size(), "fsdp": True}, f)


def load_sharded_state(path: str, model: torch.nn.Module, optimizer, frozen: dict[str, torch.nn.Module]) -> None:
    """Read back what :func:`save_sharded_state` wrote, into a model sharded the same way."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    check_resume_layout(path, dist.get_world_size(), fsdp=True)
    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    state.update({name: get_model_state_dict(m) for name, m in frozen.items()})
    dcp.load(state, checkpoint_id=os.path.join(path, "sharded"))
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
    for name, m in frozen.items():
        set_model_state_dict(m, state[name])


def check_resume_layout(path: str, world_size: int, fsdp: bool) -> None:
    """A one-line error unless the checkpoint's sharding matches (same world size; plain DP and FSDP don't mix)."""
    layout_path = os.path.join(path, LAYOUT_FILE)
    saved = None
    if os.path.exists(layout_path):
        with open(layout_path) as f:
            saved = json.load(f)
    if saved is None and not fsdp:
        return
    if saved is None or not fsdp:
        was, now = ("plain DP", "FSDP") if saved is None else ("FSDP", "plain DP")
        raise ConfigError([
            f"checkpoint {path} was written by a {was} run but this run uses {now}; set "
            f"policy.dtensor_cfg.enabled={str(saved is not None).lower()} to resume it, or start a new run_dir"
        ])
    if saved["world_size"] != world_size:
        raise ConfigError([
            f"checkpoint {path} holds optimizer state sharded over {saved['world_size']} ranks but this run has "
            f"policy.dp_size = {world_size}; resume with policy.dp_size={saved['world_size']} (resharding is not "
            "supported) or start a new run_dir"
        ])
