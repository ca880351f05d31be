"""One data-parallel rank's place in the run: data-plane client, rank, world size, device and DP group,
held by the policy, value and teacher workers and handed to their blocks."""

from __future__ import annotations

import torch

from rlplane.dataplane import DataPlaneClient, KVBatchMeta
from rlplane.fast.threads import set_worker_threads
from rlplane.runtime.devices import resolve_device, to_device
from rlplane.runtime.shared_paths import SharedPaths, check_shared_paths
from rlplane.workers import parallel


class DPRank:
    """Made first in every rank's constructor (an unreachable run directory or model is one line naming
    ``role``), then threads and device. ``group`` is None until :meth:`join`."""

    def __init__(self, role: str, policy, data_plane: DataPlaneClient | None, rank: int, world_size: int,
                 shared_paths: SharedPaths | None):
        check_shared_paths(shared_paths, role, policy.model_name)
        self.dp, self.rank, self.world_size = data_plane, rank, world_size
        set_worker_threads(policy.threads_per_worker)
        self.device = resolve_device(policy.device)
        self.group = None

    def join(self, address: str) -> None:
        """Join the group of all DP ranks (NCCL on CUDA, gloo on CPU; every rank calls it at once)."""
        self.group = parallel.init_dp_group(address, self.rank, self.world_size, self.device)

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if self.group is None:
            return t
        import torch.distributed as dist

        dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op])
        return t

    # ---- data
    def fetch(self, meta: KVBatchMeta, fields: list[str]) -> dict[str, torch.Tensor]:
        """This rank's shard of ``fields``, padded to the step's common length (all ranks alike)."""
        pad_to = meta.extra_info.get("global_forward_pad_seqlen")
        host = self.dp.get_samples(meta, meta.partition_id, fields, pad_to=pad_to)  # pads: columns.py
        return to_device(host, self.device)

    def lengths(self, meta: KVBatchMeta) -> torch.Tensor:
        """(B,) sequence lengths of the shard."""
        return torch.tensor(meta.seq_lens or (), dtype=torch.long, device=self.device)

    def sample_mask(self, meta: KVBatchMeta) -> torch.Tensor:
        """(B,) the driver's per-sample mask (tag ``sample_mask``, 1 when absent)."""
        return torch.tensor([float(t.get("sample_mask", 1.0)) for t in meta.tags], device=self.device)

    def put_rows(self, meta: KVBatchMeta, field: str, out: torch.Tensor, lengths: torch.Tensor) -> KVBatchMeta:
        """Write (B, T) ``out`` back as ``field``, rows cut to their lengths; returns the receipt for the driver."""
        return self.dp.put_samples(list(meta.sample_ids), meta.partition_id,
                                   {field: [out[i, : lengths[i]] for i in range(len(out))]})

    def lockstep(self, model: torch.nn.Module, num_local: int):
        """Under FSDP, a callable running the no-op forwards this rank owes after ``num_local`` forwards; call it
        before the first forward (agreeing on the count is a collective)."""
        extra = parallel.extra_forward_rounds(num_local, model, self.group, self.device)

        def finish() -> None:
            for _ in range(extra):
                parallel.noop_forward(model, self.device)

        return finish


def placement() -> dict:
    """Under Ray: the node, placement group and bundle this actor runs in."""
    from rlplane.runtime.placement import current_placement

    return current_placement()


def node_address() -> str:
    """``ip:port`` of a free port on this node: where rank 0 hosts the DP group's rendezvous."""
    import socket

    import ray

    ip = ray.util.get_node_ip_address()
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return f"{ip}:{port}"
