"""Which GPU each Ray actor gets under ``policy.device: cuda``, on a Ray instance that counts GPUs this machine
does not have (``ray.init(num_gpus=N)``: Ray hands out GPU ids and ``CUDA_VISIBLE_DEVICES`` as on a GPU node).

Colocated, generator ``i`` must land on policy rank ``i``'s GPU (each asks for half of it) and a critic rank on a
GPU of its own, whatever order Ray places them in; split, every generator on a GPU no policy rank holds.
The actors are probes placed exactly as ``Workers.start`` places the workers (its plan, slots and requests);
the run itself on a real GPU is ``scripts/gpu_kit/check.sh``'s ``ray`` part.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import itertools, json, sys, time
    import ray
    from rlplane.config.loading import load_config
    from rlplane.runtime import placement
    from rlplane.training.plan import build_plan

    ray.init(num_cpus=8, num_gpus=4, include_dashboard=False, log_to_driver=False)

    @ray.remote(num_cpus=0)
    class Probe:
        def gpus(self):
            return [int(i) for i in ray.get_gpu_ids()]

    out = []
    for colocated, dp, gens, critic, teacher in json.loads(sys.argv[1]):
        # The recipe brings the role: PPO (GAE) a critic, distillation a teacher.
        preset, loop = ("ppo_arithmetic", "ppo") if critic else ("distill_arithmetic", "distillation") if teacher \
            else (None, "grpo")
        cfg = load_config(preset, ["runtime=ray", "data_plane.backend=ray", "policy.device=auto",
                                   f"policy.generation.colocated.enabled={colocated}",
                                   f"policy.dp_size={dp}", f"policy.generation.num_generators={gens}",
                                   f"{loop}.num_prompts_per_step={4 * dp}", f"{loop}.num_generations_per_prompt=2",
                                   f"policy.train_global_batch_size={8 * dp}", f"policy.logprob_batch_size={8 * dp}"])
        run_plan = build_plan(cfg, cluster_gpus=4)  # one GPU per trained rank
        plan = run_plan.placement
        requests = {("generators" if r.name == "generator" else r.name): r.gpus for r in run_plan.roles}
        names = [n for n in ("policy", "value", "teacher", "generators") if n in plan.slots]
        # Ray may place the groups in any order: every order for one rank with a critic, else the workers' own.
        for order in itertools.permutations(names) if dp == 1 and (critic or teacher) else [names]:
            groups = placement.reserve(plan, 1, timeout_s=30)
            actors = []
            for name in order:
                for i, strategy in enumerate(placement.scheduling(groups, plan.slots[name])):
                    actors.append((name, i, Probe.options(num_gpus=requests[name],
                                                          scheduling_strategy=strategy).remote()))
            got = {f"{name} {i}": ray.get(a.gpus.remote(), timeout=30) for name, i, a in actors}
            out.append({"case": [colocated, dp, gens, critic, teacher], "order": order, "requests": requests,
                        "bundles": plan.bundles, "gpus": got})
            for _, _, a in actors:
                ray.kill(a)
            placement.release(groups)
            while ray.available_resources().get("GPU", 0) < 4:  # freed asynchronously
                time.sleep(0.1)
    print(json.dumps(out))
""")


def _placements(cases) -> list[dict]:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(cases)], capture_output=True, text=True,
                          timeout=240, env={**__import__("os").environ, "RAY_ADDRESS": "local"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_generators_share_the_policy_gpu_colocated_and_get_their_own_split():
    # (colocated, dp_size, generators, critic, teacher); split cases need at most 4 GPUs
    cases = [(True, 1, 1, False, False), (True, 1, 1, True, False), (True, 2, 2, True, False),
             (True, 1, 2, False, False), (True, 1, 1, False, True), (False, 1, 1, False, False),
             (False, 1, 2, True, False), (False, 1, 1, False, True)]
    for r in _placements(cases):
        colocated, dp, gens, critic, teacher = r["case"]
        gpus, where = r["gpus"], f"{r['case']} placed in order {r['order']}"
        assert all(len(ids) == 1 for ids in gpus.values()), where  # each actor sees exactly one GPU
        policy = {i: gpus[f"policy {i}"][0] for i in range(dp)}
        generators = {j: gpus[f"generators {j}"][0] for j in range(gens)}
        values = {i: gpus[f"value {i}"][0] for i in range(dp)} if critic else {}
        assert len(set(policy.values())) == dp, where  # one GPU per rank
        assert not set(values.values()) & set(policy.values()), where  # a critic rank never shares the policy's
        if teacher:  # teacher rank i computes on policy rank i's GPU
            assert all(gpus[f"teacher {i}"][0] == policy[i] for i in range(dp)), where
        if colocated:
            assert r["requests"]["policy"] == r["requests"]["generators"] == 1 / (2 + teacher)
            for j, gpu in generators.items():
                if j < dp:  # beside rank j: its GPU
                    assert gpu == policy[j], where
                else:  # past the ranks: a GPU of its own
                    assert gpu not in {*policy.values(), *values.values()}, where
        else:
            assert r["requests"]["generators"] == 1.0 and r["requests"]["policy"] == 1 / (1 + teacher)
            assert not set(generators.values()) & {*policy.values(), *values.values()}, where
            assert len(set(generators.values())) == gens, where


@pytest.mark.timeout(180)
def test_a_split_layout_on_one_gpu_is_refused_before_any_actor_starts(tmp_path):
    """cluster.gpus_per_node=1 (Ray counts one GPU): split generators need a second one, said in one line, rc 2."""
    import os

    proc = subprocess.run(
        [sys.executable, "-m", "rlplane.cli", "train", "runtime=ray", "data_plane.backend=ray", "policy.device=auto",
         "cluster.gpus_per_node=1", "policy.generation.colocated.enabled=false", "grpo.max_num_steps=1",
         "warmup.enabled=false", f"run_dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=170, env={**os.environ, "RAY_ADDRESS": "local"})
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert last.startswith("rlplane: error: policy.generation.colocated (split): the placement bundles") and (
        "need 2 GPU in all" in last), last
