"""The data plane's key index after many async-shaped steps: slots, tombstones and approximate bytes.

Each step writes the next step's keys before it clears its own (async GRPO's pattern: the partition
is never re-registered empty), 64 keys a step. One command, a table per backend:

    PYTHONPATH=src python benchmarks/dataplane_index.py [--steps 10000] [--keys 64] [--no-ray]

Bytes are the index's own structures (`PlaneIndex.footprint`: containers, arrays, key strings and tag
dicts by sys.getsizeof / nbytes), not the stored columns.
"""

from __future__ import annotations

import argparse

import torch

from rlplane.dataplane import make_data_plane


def run(client, steps: int, keys: int) -> dict:
    pid = "async"
    client.register_partition(pid, ["reward"], keys)
    client.put_samples([f"s0_k{i}" for i in range(keys)], pid, {"reward": torch.rand(keys)})
    for step in range(steps):
        nxt = [f"s{step + 1}_k{i}" for i in range(keys)]
        client.put_samples(nxt, pid, {"reward": torch.rand(keys)}, tags=[{"step": step + 1}] * keys)
        client.clear_samples([f"s{step}_k{i}" for i in range(keys)], pid, wait=False)
    return client.footprint(pid)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--keys", type=int, default=64)
    ap.add_argument("--no-ray", action="store_true", help="only the memory backend")
    args = ap.parse_args()
    planes = {"memory": lambda: make_data_plane("memory")}
    if not args.no_ray:
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        planes["ray (store actor)"] = lambda: make_data_plane("ray")
        planes["ray (driver index)"] = lambda: make_data_plane("ray", index="driver")
    print(f"{args.steps} steps of {args.keys} keys (next step's keys written before this step's are cleared)")
    print(f"{'backend':<20} {'live keys':>9} {'slots':>7} {'tombstones':>10} {'chunks':>6} {'index bytes':>11}")
    for name, make in planes.items():
        client = make()
        fp = run(client, args.steps, args.keys)
        client.close()
        print(f"{name:<20} {fp['live_keys']:>9} {fp['slots']:>7} {fp['tombstones']:>10} {fp['chunks']:>6} "
              f"{fp['bytes']:>11,}")


if __name__ == "__main__":
    main()
