"""The pieces of many generators and placement: spreading prompt groups, merging metrics, one
weight fetch per refit for every generator, the hf engine's sleep/wake, and the placement plan
with its fit check."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlplane.config.loading import ConfigError, load_config
from rlplane.runtime.groups import LocalGroup
from rlplane.runtime.placement import check_bundles_fit, plan_placement
from rlplane.training.generators import Generators, merge_metrics, spread
from rlplane.training.refit import Refit
from rlplane.training.weight_check import WeightCheckOptions
from tests.tiny import rollout_worker


def test_spread_keeps_ranges_contiguous_and_balanced():
    assert spread(5, 2) == [(0, 3), (3, 5)]
    assert spread(4, 2) == [(0, 2), (2, 4)]
    assert spread(1, 3) == [(0, 1), (1, 1), (1, 1)]  # the idle generators get empty ranges
    assert spread(7, 3) == [(0, 3), (3, 5), (5, 7)]


def test_merge_metrics_weights_means_by_rows_sums_counts_and_takes_max():
    parts = [
        ({"mean_gen_tokens_per_sample": 4.0, "max_gen_tokens_per_sample": 6.0, "env_errors": 1.0,
          "env_error_rate": 1 / 12}, 12),
        ({"mean_gen_tokens_per_sample": 1.0, "max_gen_tokens_per_sample": 8.0, "env_errors": 2.0,
          "env_error_rate": 2 / 8}, 8),
    ]
    m = merge_metrics(parts)
    assert m["mean_gen_tokens_per_sample"] == pytest.approx((4 * 12 + 1 * 8) / 20)  # 56 / 20 = 2.8
    assert m["max_gen_tokens_per_sample"] == 8.0
    assert m["env_errors"] == 3.0
    assert m["env_error_rate"] == pytest.approx(3 / 20)  # (1 + 2) errors over 20 samples


class Recorder:
    """A rollout worker stand-in that records the weights it is given and its rollouts."""

    def __init__(self):
        self.weights, self.rollouts = [], []

    def update_weights(self, w, version=None):
        self.weights.append(w)

    def rollout(self, datums, *, group_size, partition_id, greedy=False):
        self.rollouts.append(list(datums))
        n = len(datums) * group_size
        carry = {"rewards": torch.arange(n, dtype=torch.float32),
                 "group": torch.arange(len(datums)).repeat_interleave(group_size)}
        return None, carry, {"env_errors": 1.0}


def test_refit_fetches_the_weights_once_for_every_generator():
    fetched = []

    def get_weights():
        fetched.append(1)
        return {"w": torch.ones(2)}

    gens = LocalGroup(Recorder, [{}, {}])
    workers = SimpleNamespace(policy=SimpleNamespace(lazy=lambda method: get_weights()),
                              generator_shares_weights=False, rollout=Generators(gens))
    refit = Refit(workers, WeightCheckOptions("off", None))
    refit.mark_stale()
    refit.if_stale()
    assert len(fetched) == 1  # one get_weights: under Ray one object in the store
    a, b = (w.weights for w in gens.workers)
    assert len(a) == len(b) == 1 and a[0] is b[0]  # the same object (reference) to both
    refit.if_stale()
    assert len(fetched) == 1  # not stale any more


def test_generators_spread_by_group_and_offset_group_indices():
    gens = Generators(LocalGroup(Recorder, [{}, {}]))
    _, carry, metrics = gens.rollout(["p0", "p1", "p2"], group_size=2, partition_id=None)
    assert [w.rollouts for w in gens.group.workers] == [[["p0", "p1"]], [["p2"]]]
    assert carry["group"].tolist() == [0, 0, 1, 1, 2, 2]  # generator 1's group 0 is prompt 2
    assert carry["rewards"].tolist() == [0, 1, 2, 3, 0, 1]
    assert metrics["env_errors"] == 2.0


def test_hf_engine_sleeps_and_wakes_with_the_same_samples():
    from rlplane.generation.hf import HFGenerationBackend
    from rlplane.models.configured import load_configured_policy

    cfg = load_config(None, [])
    model, tok = load_configured_policy(cfg.policy, cfg.loop.seed)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    backend = HFGenerationBackend(model, tok)
    prompt = [tok.encode("1+2=")]

    def sample():
        return backend.generate(prompt, max_new_tokens=4, temperature=1.0, row_seeds=[7]).output_ids

    before = sample()
    total = sum(p.numel() for p in model.parameters())
    backend.sleep()
    assert backend.asleep and sum(p.numel() for p in model.parameters()) == 0
    backend.update_weights(state)
    assert not backend.asleep and sum(p.numel() for p in model.parameters()) == total
    assert sample() == before


def test_colocated_plan_shares_bundles_split_plan_separates_them():
    kw = dict(rank_cpus={"policy": 0.5, "value": 0.25}, generator_cpus=0.5, rank_gpus={"policy": 1.0, "value": 1.0})
    co = plan_placement(dp_size=2, num_generators=3, colocated=True, **kw)
    # Bundle i: policy + critic rank i (0.5 + 0.25 CPU, 1 + 1 GPU) and generator i (0.5 CPU); bundle 2 a generator.
    assert co.bundles == {"colocated": [{"CPU": 1.25, "GPU": 2.0}, {"CPU": 1.25, "GPU": 2.0}, {"CPU": 0.5}]}
    assert co.slots["policy"] == co.slots["value"] == [("colocated", 0), ("colocated", 1)]
    assert co.slots["generators"] == [("colocated", 0), ("colocated", 1), ("colocated", 2)]
    split = plan_placement(dp_size=2, num_generators=3, colocated=False, **kw)
    assert split.bundles == {"train": [{"CPU": 0.75, "GPU": 2.0}] * 2, "generation": [{"CPU": 0.5}] * 3}
    assert split.slots["generators"] == [("generation", j) for j in range(3)]
    # Over several nodes the generation bundles keep off the train bundles' nodes; on one node, or
    # colocated (sharing bundles is the point), nothing is kept apart.
    assert split.apart == co.apart == {}
    assert plan_placement(dp_size=2, num_generators=3, colocated=False, num_nodes=2, **kw).apart == {
        "generation": "train"}
    assert plan_placement(dp_size=2, num_generators=3, colocated=True, num_nodes=2, **kw).apart == {}


def test_generators_compute_on_gpus_where_the_policy_does():
    from rlplane.runtime.devices import gpu_requests
    from rlplane.training.plan import build_plan

    kw = dict(rank_cpus={"policy": 0.5}, generator_cpus=0.5, rank_gpus={"policy": 1.0}, generator_gpus=0.5)
    # Colocated: generator 0 shares rank 0's GPU (no GPU added to bundle 0); generator 1, past the ranks, its half.
    co = plan_placement(dp_size=1, num_generators=2, colocated=True, **kw)
    assert co.bundles == {"colocated": [{"CPU": 1.0, "GPU": 1.0}, {"CPU": 0.5, "GPU": 0.5}]}
    split = plan_placement(dp_size=1, num_generators=2, colocated=False, **{**kw, "generator_gpus": 2.0})
    assert split.bundles == {"train": [{"CPU": 0.5, "GPU": 1.0}], "generation": [{"CPU": 0.5, "GPU": 2.0}] * 2}

    def gpus(*over, cluster_gpus=2.0, preset=None):
        """Each role's GPUs and the bundles, a trained rank on a GPU of its own (``policy.device: auto`` on a
        cluster with GPUs) or on CPU (none)."""
        cfg = load_config(preset, ["runtime=ray", "data_plane.backend=ray", "policy.device=auto", *over])
        plan = build_plan(cfg, cluster_gpus=cluster_gpus)
        return {r.name: r.gpus for r in plan.roles}, plan.placement.bundles

    teacher = "distill_arithmetic"  # distillation's teacher role
    # Rank i's GPU split evenly among policy rank i, colocated generator i and a teacher's rank i; a split
    # generator gets its own (a vLLM engine: tensor_parallel_size of them); a critic rank a whole one.
    assert gpus()[0] == {"policy": 0.5, "generator": 0.5}
    assert gpus(preset=teacher)[0] == {"policy": 1 / 3, "teacher": 1 / 3, "generator": 1 / 3}
    assert gpus(preset="ppo_arithmetic")[0] == {"policy": 0.5, "value": 1.0, "generator": 0.5}
    assert gpus("policy.generation.colocated.enabled=false")[0] == {"policy": 1.0, "generator": 1.0}
    assert gpus("policy.generation.colocated.enabled=false", preset=teacher)[0] == {
        "policy": 0.5, "teacher": 0.5, "generator": 1.0}
    assert gpu_requests(1.0, colocated=False, tensor_parallel=2)["generator"] == 2.0  # a vLLM engine over 2 GPUs
    assert gpus(cluster_gpus=0.0) == ({"policy": 0.0, "generator": 0.0}, {"colocated": [{"CPU": 1.0}]})
    assert gpus("policy.generation.colocated.enabled=false", cluster_gpus=0.0)[1] == {
        "train": [{"CPU": 0.5}], "generation": [{"CPU": 0.5}]}


def test_async_collector_gpu_counts_against_the_cluster():
    from rlplane.training.plan import build_plan

    over = ["runtime=ray", "data_plane.backend=ray", "grpo.async_grpo.enabled=true",
            "loss_fn.use_importance_sampling_correction=true"]

    def collector_gpus(cfg, cluster_gpus):
        plan = build_plan(cfg, cluster_gpus=cluster_gpus)
        return plan.role("collector").gpus if plan.has("collector") else 0.0

    cfg = load_config(None, [*over, "policy.device=auto"])
    assert collector_gpus(cfg, 0) == 0.0 and collector_gpus(cfg, 2) == 1.0  # auto: a GPU when the cluster has one
    assert collector_gpus(load_config(None, [*over, "policy.device=cpu"]), 2) == 0.0
    assert collector_gpus(load_config(None, ["runtime=ray", "data_plane.backend=ray"]), 2) == 0.0  # sync: none


def test_bundles_that_do_not_fit_are_one_line_errors():
    plan = plan_placement(dp_size=2, num_generators=2, colocated=True, rank_cpus={"policy": 0.5},
                          generator_cpus=0.5, rank_gpus={"policy": 1.0})
    check_bundles_fit(plan, [{"CPU": 2.0, "GPU": 2.0}], num_nodes=1, mode="colocated")  # 2 CPU, 2 GPU: fits
    cases = [
        ([{"CPU": 2.0, "GPU": 1.0}], 1, "need 2 GPU in all"),
        ([{"CPU": 1.0, "GPU": 2.0}], 1, "need 2 CPU in all"),
        ([{"CPU": 0.5, "GPU": 1.0}] * 4, 1, "1 in one bundle, but the Ray cluster has 2 (0.5 on its largest node)"),
        ([{"CPU": 2.0, "GPU": 2.0}], 2, "cluster.num_nodes = 2 but the Ray cluster has 1 node"),
    ]
    for nodes, num_nodes, words in cases:
        with pytest.raises(ConfigError) as e:
            check_bundles_fit(plan, nodes, num_nodes=num_nodes, mode="colocated")
        assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_generators_count_in_the_ray_cpu_demand_and_async_grpo_takes_one():
    from rlplane.training.plan import build_plan
    from rlplane.training.workers import ray_cpu_demand

    cfg = load_config(None, ["runtime=ray", "data_plane.backend=ray", "policy.generation.num_generators=3"])
    assert ray_cpu_demand(build_plan(cfg)) == 0.5 + 3 * 0.5  # a policy rank + three generators
    with pytest.raises(ConfigError, match="num_generators = 2 with grpo.async_grpo.enabled"):
        load_config(None, ["grpo.async_grpo.enabled=true", "loss_fn.use_importance_sampling_correction=true",
                           "policy.generation.num_generators=2"])


def test_hf_decode_config_key_reaches_the_backend():
    from rlplane.models.configured import load_configured_policy

    for value in ("auto", "hf", "fused", "graph"):
        cfg = load_config(None, [f"policy.generation.hf_decode={value}"])
        model, tok = load_configured_policy(cfg.policy, cfg.loop.seed)
        assert rollout_worker(cfg, None, model=model, tokenizer=tok).backend.decode == value
    with pytest.raises(ConfigError, match="hf_decode"):
        load_config(None, ["policy.generation.hf_decode=fast"])
