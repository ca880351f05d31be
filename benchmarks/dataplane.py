"""The data plane's step against a hand-written raw-Ray baseline, same data, same run.

    python benchmarks/dataplane.py [--samples 1000] [--mean-tokens 1000] [--steps 7] [--multi-node]

--multi-node runs the same comparison on a real local multi-node cluster (`ray.cluster_utils.Cluster`):
a head raylet for the driver and one worker raylet per DP rank, each with its own CPUs, object
store and a custom resource that pins one rank to it, so every column crosses between raylets'
object stores (driver -> rank and back), as on a cluster of machines.

One step (what a sync GRPO step asks of the data plane):
  put 1000 samples (input_ids int64, generation_logprobs fp32, token_mask bool: per token; reward
  fp32: per sample) -> 2 actor DP ranks fetch their shard padded (B, T) -> each writes a padded
  prev_logprobs column back -> the driver reads prev_logprobs for all samples, padded, in the
  original order -> clear (without waiting for the store's answer, as the trainer's step-end clear).

Variants:
  ray        rlplane's `ray` backend with the index in the driver (`index="driver"`): a rank reads
             from where the meta it was sent says its rows are (no call), writes back, and returns
             its receipt, which the driver's index takes as it arrives; the driver prefetches
             each rank's column as its receipt comes (as raw's ray.wait pulls each rank's result),
             then reads from it.
             With --multi-node the driver's put is split by the ranks' DP shards
             (`put_samples(shards=dp_shard_rows(...))`), one object each.
  ray/actor  the same with the index in a store actor (`index="store"`, the default): a rank handed
             the put's receipt reads from it while the store verifies it is current, and commits
             its write-back there; the driver reads the ranks' receipts the same way.
  ray/store  the store actor with owner="store" (data outlives its producer; one extra copy per put).
  raw        what one would write by hand: the driver packs each column jagged (numpy values +
             offsets) per DP shard, one ray.put per shard; actors get and pad it, return their
             packed new column as an object; the driver pads the results back in order; refs dropped.

Both materialise the same padded tensors on both sides, so the difference is the plane's
bookkeeping: store-actor round trips, the key index, gathering rows by key.
MB/s counts the batch's payload (13 bytes per token + 4 per sample) over the whole step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np
import ray
import torch

from rlplane.dataplane import concat_metas, dp_shard_rows, make_data_plane, shard_meta_for_dp

torch.set_num_threads(1)
FIELDS = ["input_ids", "generation_logprobs", "token_mask", "reward", "prev_logprobs"]


def start_cluster(num_ranks: int):
    """A head raylet (the driver's node: 1 CPU) and `num_ranks` worker raylets, each with 1 CPU, its
    own object store and a `dp_rank_<r>` resource that only rank r asks for."""
    from ray.cluster_utils import Cluster

    # Cluster() records its address in Ray's shared "current cluster" file; put back whatever was
    # there, so other users' ray.init(address="auto") on this machine are not sent to this cluster.
    # (It must be writable, so its folder is made if missing and removed again after.)
    marker_dir = os.path.join(tempfile.gettempdir(), "ray")
    marker = os.path.join(marker_dir, "ray_current_cluster")
    made_dir = not os.path.isdir(marker_dir)
    os.makedirs(marker_dir, exist_ok=True)
    before = open(marker).read() if os.path.exists(marker) else None
    common = {"object_store_memory": 2**30, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args={
        **common, "num_cpus": 1, "temp_dir": tempfile.mkdtemp(prefix="rlplane-bench-mn-")})
    for r in range(num_ranks):
        cluster.add_node(**common, num_cpus=1, resources={f"dp_rank_{r}": 1})
    cluster.wait_for_nodes()
    if before is not None:
        with open(marker, "w") as f:
            f.write(before)
    elif os.path.exists(marker):
        os.remove(marker)
    if made_dir:
        os.rmdir(marker_dir)
    return cluster


def make_batch(n: int, mean_tokens: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(mean_tokens // 4, 2 * mean_tokens - mean_tokens // 4 + 1, (n,), generator=g).tolist()
    return {
        "input_ids": [torch.randint(0, 50_000, (L,), generator=g) for L in lens],
        "generation_logprobs": [-torch.rand(L, generator=g) for L in lens],
        "token_mask": [torch.ones(L, dtype=torch.bool) for L in lens],
        "reward": torch.rand(n, generator=g),
    }, lens


def as_tensor(a: np.ndarray) -> torch.Tensor:
    """Zero-copy tensor over a (possibly read-only, object-store) numpy array; only ever read."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(a)


def pad_rows(values: torch.Tensor, lens: list[int], T: int) -> torch.Tensor:
    """(B, T) from packed values: the hand-written baseline's materialisation."""
    out = torch.nn.utils.rnn.pad_sequence(list(torch.split(values, lens)), batch_first=True)
    return torch.nn.functional.pad(out, (0, T - out.shape[1]))


@ray.remote(num_cpus=0.5)
class Rank:
    """One DP rank; the same two actors serve every variant."""

    def __init__(self, clients):
        self.clients = clients  # variant name -> data-plane client (arrives as a store handle)

    def plane_step(self, variant, meta):
        client = self.clients[variant]
        cols = client.get_samples(meta, None, ["input_ids", "generation_logprobs", "token_mask"])
        prev = cols["generation_logprobs"] * cols["token_mask"]  # (B, T) stand-in for a forward pass
        return client.put_samples(meta, None, {"prev_logprobs": prev})  # its receipt, as the driver's

    def node(self):
        return ray.get_runtime_context().get_node_id()

    def raw_step(self, shard, T):
        lens = np.diff(shard["offsets"]).tolist()
        with torch.no_grad():
            lp = pad_rows(as_tensor(shard["generation_logprobs"]), lens, T)
            mask = pad_rows(as_tensor(shard["token_mask"]), lens, T)
            ids = pad_rows(as_tensor(shard["input_ids"]), lens, T)
            assert ids.shape == lp.shape
            prev = lp * mask  # (B, T)
        keep = torch.arange(T) < torch.tensor(lens)[:, None]
        return {"values": prev[keep].numpy(), "offsets": shard["offsets"]}


def pack_shard(batch, rows):
    lens = [len(batch["input_ids"][i]) for i in rows]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    shard = {f: torch.cat([batch[f][i] for i in rows]).numpy() for f in ("input_ids", "generation_logprobs",
                                                                         "token_mask")}
    shard["reward"] = batch["reward"][rows].numpy()
    shard["offsets"] = offsets
    return shard


def raw_step(ranks, batch, lens, timings):
    n = len(lens)
    t0 = time.perf_counter()
    halves = [list(range(0, n, 2)), list(range(1, n, 2))]  # interleaved halves: balanced enough here
    refs = [ray.put(pack_shard(batch, rows)) for rows in halves]
    t1 = time.perf_counter()
    T = max(lens)
    outs = [r.raw_step.remote(ref, T) for r, ref in zip(ranks, refs)]
    ray.wait(outs, num_returns=len(outs))
    t2 = time.perf_counter()
    full = torch.zeros(n, T)
    for rows, res in zip(halves, ray.get(outs)):
        o = res["offsets"]
        full[torch.tensor(rows)] = pad_rows(as_tensor(res["values"]), np.diff(o).tolist(), T)
    t3 = time.perf_counter()
    del refs, outs  # "clear": Ray frees objects when their last ref goes
    t4 = time.perf_counter()
    timings.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0))
    return full


def plane_step(variant, client, ranks, batch, lens, ids, step, timings, split):
    pid = f"train{step}"
    t0 = time.perf_counter()
    client.register_partition(pid, FIELDS, len(ids))
    # Across nodes, stored by the DP shards the ranks will read (as the raw baseline packs its
    # shards), so each rank pulls only its own; on one node a rank maps the whole object for free,
    # and two puts cost more than one (4.1 ms for one 13 MB put, 7.4 ms for two halves, measured).
    meta = client.put_samples(ids, pid, batch, shards=dp_shard_rows(lens, len(ranks)) if split else None)
    t1 = time.perf_counter()
    metas, inverse = shard_meta_for_dp(meta, len(ranks))
    calls = [r.plane_step.remote(variant, client.located(m)) for r, m in zip(ranks, metas)]  # as a RayGroup sends
    rank_of = {ref: i for i, ref in enumerate(calls)}
    written: list = [None] * len(calls)
    while calls:  # each rank's receipt as it comes: its column starts moving here while the other works
        done, calls = ray.wait(calls, num_returns=1)
        written[rank_of[done[0]]] = receipt = ray.get(done[0])
        client.commit_receipts(receipt)  # into the driver's index (as a RayGroup does with its results)
        client.prefetch(receipt)
    t2 = time.perf_counter()
    # The ranks' receipts, in the original order: read from their objects (the store actor verifies
    # them meanwhile; a driver-held index checks them in-process).
    full = client.get_samples(concat_metas(written).subset(inverse), None, ["prev_logprobs"])["prev_logprobs"]
    t3 = time.perf_counter()
    client.clear_samples(meta, None, wait=False)  # as the trainer's step-end clear
    t4 = time.perf_counter()
    timings.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0))
    return full


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--mean-tokens", type=int, default=1000)
    p.add_argument("--steps", type=int, default=7, help="timed steps per variant (after 1 warm-up)")
    p.add_argument("--multi-node", action="store_true",
                   help="head + 2 worker raylets (ray.cluster_utils.Cluster); each DP rank on its own raylet")
    args = p.parse_args()

    runtime_env = {"env_vars": {"OMP_WAIT_POLICY": "PASSIVE"}}
    cluster = None
    if args.multi_node:
        cluster = start_cluster(num_ranks=2)
        ray.init(address=cluster.address, log_to_driver=False, runtime_env=runtime_env)
        placements = [{"resources": {f"dp_rank_{r}": 1}} for r in range(2)]
    else:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=2 * 2**30,
                 _temp_dir=tempfile.mkdtemp(prefix="rlplane-bench-"), runtime_env=runtime_env)
        placements = [{}, {}]
    batch, lens = make_batch(args.samples, args.mean_tokens)
    ntok = sum(lens)
    payload = ntok * (8 + 4 + 1) + 4 * args.samples
    print(f"batch: {args.samples} samples, {ntok} tokens (mean "
          f"{ntok / args.samples:.0f}), payload {payload / 1e6:.1f} MB; "
          f"load average {os.getloadavg()[0]:.2f}")

    planes = {"ray": make_data_plane("ray", index="driver"), "ray/actor": make_data_plane("ray"),
              "ray/store": make_data_plane("ray", owner="store")}
    variants = {**planes, "raw": None}
    ranks = [Rank.options(**opts).remote({k: v for k, v in variants.items() if v is not None}) for opts in placements]
    ray.get([r.__ray_ready__.remote() for r in ranks])
    if cluster is not None:
        driver_node = ray.get_runtime_context().get_node_id()
        rank_nodes = ray.get([r.node.remote() for r in ranks])
        assert len({driver_node, *rank_nodes}) == 3, "the driver and both ranks must be on different raylets"
        print(f"multi-node: {len(ray.nodes())} raylets; driver on {driver_node[:8]}, ranks on "
              + ", ".join(n[:8] for n in rank_nodes))
    expected = None
    timings: dict[str, list] = {k: [] for k in variants}
    for step in range(args.steps + 1):  # interleaved so that background load hits every variant alike
        for name, client in variants.items():
            ids = [f"s{step}_{i}" for i in range(args.samples)]
            t: list = []
            out = raw_step(ranks, batch, lens, t) if client is None else plane_step(name, client, ranks, batch, lens,
                                                                                    ids, step, t, args.multi_node)
            if expected is None:
                expected = out
            assert torch.equal(out, expected), name  # every variant computes the same column
            if step > 0:
                timings[name].extend(t)

    print(f"{'variant':<10} {'step ms':>8} {'samples/s':>10} {'MB/s':>7}   put / 2 ranks / driver read / clear (ms)")
    med = {}
    for name, ts in timings.items():
        cols = [statistics.median(x) * 1e3 for x in zip(*ts)]
        med[name] = cols[-1]
        s = cols[-1] / 1e3
        print(f"{name:<10} {cols[-1]:8.1f} {args.samples / s:10.0f} {payload / s / 1e6:7.0f}   "
              + " / ".join(f"{c:.1f}" for c in cols[:4]))
    print(f"ratio ray/raw = {med['ray'] / med['raw']:.2f}x (target <= 1.0x); "
          + "; ".join(f"{k} / raw = {med[k] / med['raw']:.2f}x" for k in ("ray/actor", "ray/store"))
          + f"; load average {os.getloadavg()[0]:.2f}")
    for plane in planes.values():
        plane.close()
    ray.shutdown()
    if cluster is not None:
        cluster.shutdown()


if __name__ == "__main__":
    main()
