"""One policy worker and two data-parallel Ray workers (gloo) take the same step on the same batch."""

from __future__ import annotations

import pytest
import torch

from rlplane.config.loading import load_config
from rlplane.dataplane import make_data_plane, shard_meta_for_dp
from rlplane.recipes.grpo import TRAIN_COLUMNS
from rlplane.runtime.groups import RayGroup
from rlplane.training.plan import policy_options
from rlplane.workers.policy import ClippedPGLoss, PolicyWorker

pytestmark = pytest.mark.slow

GBS = 32


def _batch(client, n=2 * GBS, seed=0):
    """Random sequences of varied lengths with random advantages: two global batches."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(6, 14, (n,), generator=g)
    prompt = torch.randint(3, 6, (n,), generator=g)
    ids = [torch.randint(4, 21, (int(L),), generator=g) for L in lengths]
    mask = [torch.cat([torch.zeros(int(p)), torch.ones(int(L - p))]).to(torch.int8) for p, L in zip(prompt, lengths)]
    adv = torch.randn(n, generator=g)
    client.register_partition("train", TRAIN_COLUMNS, n)
    return client.put_samples(
        [f"s{i}_g0" for i in range(n)],
        "train",
        {
            "input_ids": ids,
            "token_mask": mask,
            "generation_logprobs": [torch.zeros(int(L)) for L in lengths],
            "advantages": [adv[i].expand(int(lengths[i])).clone() for i in range(n)],
        },
    )


@pytest.mark.ray
def test_one_and_two_dp_workers_give_the_same_step(ray_session):
    cfg = load_config(None, ["warmup.enabled=false", "runtime=ray", "data_plane.backend=ray", "policy.dp_size=2",
                             f"policy.train_global_batch_size={GBS}", "policy.train_micro_batch_size=8",
                             "grpo.num_prompts_per_step=16", "grpo.num_generations_per_prompt=4",
                             "policy.optimizer.lr=1e-2"])
    client = make_data_plane("ray")
    meta = _batch(client)
    loss = ClippedPGLoss(cfg.loss_fn.options(), reference=cfg.loss_fn.reference_policy_kl_penalty != 0)

    single = PolicyWorker(policy_options(cfg), client, rank=0, world_size=1)
    init = single.get_weights()
    single.compute_logprobs(meta, out_field="prev_logprobs")
    one = single.train(meta, loss)

    group = RayGroup(PolicyWorker, [dict(options=policy_options(cfg), data_plane=client, rank=r, world_size=2,
                                         init_state=init) for r in range(2)], num_cpus=0.5)
    try:
        import ray

        group.run(PolicyWorker.setup_distributed, ray.get(group.workers[0].node_address.remote()))
        metas, _ = shard_meta_for_dp(meta, 2, batch_size=GBS)
        two = group.run(PolicyWorker.train, per_rank=[{"meta": m} for m in metas], loss=loss)
        w0, w1 = group.run(PolicyWorker.get_weights)
    finally:
        group.kill()
        client.close()

    # The gradient norm is taken after the all-reduce: equal norms and equal updated weights mean
    # the summed DP gradients equal the single-worker gradient (AdamW alone would hide a scale error).
    assert two[0]["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    assert two[0]["global_valid_toks"] == one["global_valid_toks"]
    assert sum(r["loss"] for r in two) == pytest.approx(one["loss"], rel=1e-5, abs=1e-7)
    ref = single.get_weights()
    for k in ref:
        # Adam divides by sqrt(v): on near-zero gradients the float summation order (one rank vs an
        # all-reduce of two) shows up at ~1e-5 after two steps, 0.1% of the lr-sized step (1e-2).
        # A wrong shard or mask moves weights by the whole step; a wrong scale shows in grad_norm.
        torch.testing.assert_close(w0[k], ref[k], rtol=1e-3, atol=1e-4)
        torch.testing.assert_close(w1[k], w0[k], rtol=0, atol=0)
