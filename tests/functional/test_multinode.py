"""The default job on a real multi-node Ray cluster: a head node for the driver and two
worker raylets (``ray.cluster_utils.Cluster``, each raylet its own processes and resources) on
this machine; generators split from the policy (``policy.generation.colocated.enabled=false``,
``cluster.num_nodes=2``) run on another node than the policy ranks, the run checkpoints, is
SIGKILLed, resumes on the same cluster and finishes.

Each worker node has CPUs enough for a policy rank and a generator together, so only the split
placement (the generation bundles keep apart from the train bundles' nodes) puts them on different
nodes. Where each actor ran is what it reported from inside itself (``logs/placement.json``, one
per attempt), checked against the cluster's node ids.

The run is ``rlplane train`` in a subprocess joining the cluster by ``cluster.address``: the test
process may hold the shared single-node Ray of other tests (``ray_session``), which this one never
touches. The CI variant runs the tiny model for 4 steps, with a short warm-up and validation at the start
and the end; ``RLPLANE_MULTINODE_STEPS=N`` also runs the default job for N steps (50 in the docs) and checks
that held-out accuracy rose.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rlplane.utils.kill_points import KILL_VAR
from tests.tiny import TINY_RUN

SPLIT = ["runtime=ray", "data_plane.backend=ray", "cluster.num_nodes=2", "policy.generation.colocated.enabled=false",
         "logger.tensorboard_enabled=false", "logger.progress_bar=false"]
# The tiny run, 2 prompts × 4 generations; validation only where a test asks for it.
TINY = [*TINY_RUN, "grpo.num_generations_per_prompt=4", "policy.train_global_batch_size=8",
        "policy.train_micro_batch_size=8", "policy.logprob_batch_size=8", "grpo.val_at_end=false"]
# CPUs of each worker raylet: a policy rank (0.5) and a generator (0.5) would fit on either one.
WORKER_NODE_CPUS = 2


@pytest.fixture(scope="module")
def cluster():
    """A head node (no CPUs: the driver and the data plane's zero-CPU store only) and two worker
    raylets, in a temporary directory of their own; shut down after the module's tests."""
    from ray._common.utils import get_default_ray_temp_dir
    from ray.cluster_utils import Cluster

    # Cluster writes the head's address to /tmp/ray/ray_current_cluster whatever its temp_dir, and fails where
    # that folder does not exist yet (a fresh machine on which no Ray instance used the default temp dir).
    os.makedirs(get_default_ray_temp_dir(), exist_ok=True)
    temp_dir = tempfile.mkdtemp(prefix="rlplane-mnode-")
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                      "temp_dir": temp_dir})
    workers = [c.add_node(num_cpus=WORKER_NODE_CPUS) for _ in range(2)]
    c.wait_for_nodes()
    yield {"address": c.address, "head": c.head_node.node_id, "workers": {n.node_id for n in workers}}
    c.shutdown()


def train(cluster, run_dir: Path, extra: list[str], kill_at: str | None = None, timeout: float = 600
          ) -> subprocess.CompletedProcess:
    """One attempt of ``rlplane train`` joining ``cluster`` (resuming whatever ``run_dir`` holds)."""
    cmd = [sys.executable, "-m", "rlplane.cli", "train", *SPLIT, *extra, f"cluster.address={cluster['address']}",
           f"run_dir={run_dir}", "checkpointing.resume=true"]
    env = {k: v for k, v in os.environ.items() if k not in (KILL_VAR, "RAY_ADDRESS")}
    if kill_at:
        env[KILL_VAR] = kill_at
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def placement(run_dir: Path) -> dict:
    return json.loads((run_dir / "logs" / "placement.json").read_text())


def check_split_over_nodes(where: dict, cluster) -> None:
    """Policy ranks and generators ran on worker raylets, and no generator on a policy rank's node."""
    policy_nodes = {r["node_id"] for r in where["policy"]}
    generator_nodes = {g["node_id"] for g in where["generators"]}
    assert policy_nodes | generator_nodes <= cluster["workers"], (where, cluster)
    assert not policy_nodes & generator_nodes, where
    assert len({r["placement_group_id"] for r in where["policy"]}) == 1
    assert {g["placement_group_id"] for g in where["generators"]}.isdisjoint({where["policy"][0]["placement_group_id"]})


RESERVE = """
import json, sys, ray
from ray.util import placement_group_table
from rlplane.runtime import placement
ray.init(address=sys.argv[1], log_to_driver=False)
plan = placement.plan_placement(dp_size=2, num_generators=2, colocated=False, rank_cpus={"policy": float(sys.argv[2])},
                                generator_cpus=0.5, num_nodes=2)
groups = placement.reserve(plan, num_nodes=2, timeout_s=60)
print(json.dumps({name: placement_group_table(pg)["bundles_to_node_id"] for name, pg in groups.items()}))
placement.release(groups)
"""


def reserve_split(cluster, rank_cpus: float) -> subprocess.CompletedProcess:
    """Reserve 2 policy ranks of ``rank_cpus`` CPUs and 2 generators split over 2 nodes, in a driver of its own."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.run([sys.executable, "-c", RESERVE, cluster["address"], str(rank_cpus)], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.ray
def test_split_bundles_keep_off_the_train_nodes(cluster):
    """2 policy ranks and 2 generators, split over 2 nodes: the train bundles (0.5 CPU each) are packed
    on one node, the generation bundles on the other, though either node could hold all four."""
    out = reserve_split(cluster, 0.5)
    assert out.returncode == 0, out.stderr[-2000:]
    nodes = json.loads(out.stdout.strip().splitlines()[-1])
    train, generation = set(nodes["train"].values()), set(nodes["generation"].values())
    assert len(train) == len(generation) == 1 and train | generation == cluster["workers"], nodes


@pytest.mark.ray
def test_split_with_no_node_left_for_the_generators_is_a_one_line_error(cluster):
    # Two train bundles of 1.5 CPUs cannot share a worker node (2 CPUs): they take both, and the
    # generators' group is refused at once instead of waiting out the reservation timeout.
    out = reserve_split(cluster, 1.5)
    assert out.returncode != 0
    assert ("ConfigError: runtime=ray: the 'train' placement group took every node of the Ray cluster that could "
            "hold a bundle of the 'generation' group (split from it, cluster.num_nodes > 1); add nodes") in out.stderr


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines() if line]


def run_killed_and_resumed(cluster, run_dir: Path, extra: list[str], steps: int, save_period: int) -> dict:
    """The run checkpoints at step ``save_period``, is SIGKILLed after training the next step (not yet
    logged), resumes from that checkpoint and finishes at ``steps``. Returns each attempt's placement,
    the resumed attempt's output and the wall time."""
    extra = [*extra, f"grpo.max_num_steps={steps}", f"checkpointing.save_period={save_period}"]
    t0 = time.perf_counter()
    first = train(cluster, run_dir, extra, kill_at=f"train:{save_period + 1}")
    assert first.returncode == -9, first.stderr[-2000:]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == [f"step_{save_period}"]
    where_first = placement(run_dir)
    second = train(cluster, run_dir, extra)
    assert second.returncode == 0, second.stderr[-2000:]
    return {"first": where_first, "second": placement(run_dir), "out": second.stdout + second.stderr,
            "wall_s": time.perf_counter() - t0}


def check_resumed(result: dict, run_dir: Path, cluster, steps: int, save_period: int) -> list[dict]:
    assert f"resumed from {run_dir / 'checkpoints' / f'step_{save_period}'} at step {save_period}" in result["out"]
    for attempt in ("first", "second"):
        check_split_over_nodes(result[attempt], cluster)
    rows = [r for r in metrics(run_dir) if "train/loss" in r]
    # Every step logged once: the killed step (trained, not logged) was redone by the resumed attempt.
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert (run_dir / "checkpoints" / f"step_{steps}").is_dir()
    return rows


@pytest.mark.ray
def test_split_generators_on_their_own_node_checkpoint_and_resume(cluster, tmp_path):
    # A warm-up (its weights reach the ranks and generators on the worker nodes) and validation on the
    # split generators at the start and the end, as the default job has them.
    extra = [*TINY, "warmup.enabled=true", "warmup.num_steps=2", "warmup.batch_size=8", "warmup.target_accuracy=null",
             "warmup.eval_every=2", "warmup.eval_samples=4", "grpo.val_at_start=true", "grpo.val_period=4",
             "grpo.max_val_samples=4", "grpo.val_batch_size=4"]
    result = run_killed_and_resumed(cluster, tmp_path / "run", extra, steps=4, save_period=2)
    rows = check_resumed(result, tmp_path / "run", cluster, steps=4, save_period=2)
    # The generators sampled with the policy's weights across nodes (refit after the resume too).
    assert all(abs(r["train/token_mult_prob_error"] - 1.0) < 0.02 for r in rows), rows
    val = {r["step"]: r["validation/accuracy"] for r in metrics(tmp_path / "run") if "validation/accuracy" in r}
    assert sorted(val) == [0, 4], val


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("RLPLANE_MULTINODE_STEPS"),
                    reason="RLPLANE_MULTINODE_STEPS=N runs the default job for N steps")
def test_default_job_learns_across_nodes_through_a_kill(cluster, tmp_path):
    """The default job (warm-up, 500 held-out prompts) for ``RLPLANE_MULTINODE_STEPS`` steps (50 in the docs),
    killed after the half-way checkpoint: held-out accuracy at the end is above the start's."""
    steps = int(os.environ["RLPLANE_MULTINODE_STEPS"])
    run_dir = tmp_path / "run"
    extra = [f"grpo.val_period={steps}"]
    result = run_killed_and_resumed(cluster, run_dir, extra, steps=steps, save_period=steps // 2)
    check_resumed(result, run_dir, cluster, steps=steps, save_period=steps // 2)
    val = {r["step"]: r["validation/accuracy"] for r in metrics(run_dir) if "validation/accuracy" in r}
    nodes = {attempt: {role: [w["node_id"][:8] for w in where] for role, where in result[attempt].items()}
             for attempt in ("first", "second")}
    print(f"multi-node default job: worker nodes {sorted(n[:8] for n in cluster['workers'])}, nodes per role {nodes}; "
          f"accuracy {val}; wall {result['wall_s']:.0f} s")
    assert sorted(val) == [0, steps] and val[steps] > val[0], val
