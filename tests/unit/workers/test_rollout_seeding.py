"""Rollouts seeded per sample key and weight version: 1 or 2 rollout workers, any batch order or
split, give the same tokens and logprobs for the same sample; other keys or versions differ."""

from __future__ import annotations

import pytest
import torch

from rlplane.config.loading import load_config
from rlplane.dataplane import make_data_plane
from rlplane.datasets import build_datasets
from rlplane.models.configured import load_configured_policy
from rlplane.workers.rollout import sample_keys
from tests.tiny import rollout_worker

G = 3
COLS = ["input_ids", "generation_logprobs"]


@pytest.fixture(scope="module")
def setup():
    cfg = load_config(None, ["grpo.num_prompts_per_step=4", f"grpo.num_generations_per_prompt={G}",
                             "policy.train_global_batch_size=12", "data.num_train_samples=64",
                             "policy.generation.max_new_tokens=6"])
    model, tok = load_configured_policy(cfg.policy, cfg.loop.seed)
    loader, _, _ = build_datasets(cfg.dataset_options(), tok)
    datums = next(loader) + next(loader)  # 8 prompts
    return cfg, model, tok, datums


def rollout(worker, dp, datums, version=0):
    """Sample -> (input_ids, generation_logprobs) for each of ``datums``' rows, keyed by sample key."""
    dp.register_partition("p", [*COLS, "token_mask"], len(datums) * G)
    meta, _, _ = worker.rollout(datums, group_size=G, partition_id="p", weight_version=version)
    cols = dp.get_samples(meta, "p", COLS)
    dp.clear_samples(meta, "p")
    keys = sample_keys(datums, G, "train")
    return {k: (cols["input_ids"][r, : meta.seq_lens[r]].tolist(), cols["generation_logprobs"][r, : meta.seq_lens[r]])
            for r, k in enumerate(keys)}


def same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k][0] == b[k][0], k
        torch.testing.assert_close(a[k][1], b[k][1], atol=1e-5, rtol=1e-5)


def test_one_or_two_workers_any_order_same_samples(setup):
    cfg, model, tok, datums = setup
    dp = make_data_plane("memory")
    one = rollout_worker(cfg, dp, model=model, tokenizer=tok, seed=0)
    # A second worker with its own model copy and another generator seed (the collector's is seed + 3).
    copy, _ = load_configured_policy(cfg.policy, cfg.loop.seed)
    copy.load_state_dict(model.state_dict())
    two = [rollout_worker(cfg, dp, model=m, tokenizer=tok, seed=s) for m, s in ((model, 5), (copy, 9))]
    reference = rollout(one, dp, datums)
    same(reference, {**rollout(two[1], dp, datums[5:]), **rollout(two[0], dp, datums[:5])})  # split, reversed
    same(reference, rollout(one, dp, datums[::-1]))  # other batch order
    same(reference, {k: v for d in datums for k, v in rollout(two[1], dp, [d]).items()})  # one prompt per call
    # The group's members differ from each other; another weight version draws other samples.
    responses = [v[0] for v in reference.values()]
    assert len({tuple(r) for r in responses}) > len(datums)
    other = rollout(one, dp, datums, version=1)
    assert sum(other[k][0] != reference[k][0] for k in reference) > len(reference) // 2
    # The version set by the trainer is the default.
    one.set_weight_version(1)
    dp.register_partition("p", [*COLS, "token_mask"], len(datums) * G)
    meta, _, _ = one.rollout(datums, group_size=G, partition_id="p")
    ids = dp.get_samples(meta, "p", ["input_ids"])["input_ids"]
    assert ids[0, : meta.seq_lens[0]].tolist() == other[sample_keys(datums, G, "train")[0]][0]


def test_sample_keys_name_the_draw():
    from rlplane.data.datum import DatumSpec

    d = DatumSpec(message_log=[], extra_env_info={}, task_name="t", idx=7, length=0, epoch=2)
    assert sample_keys([d], 2, "train") == ["train/e2/p7_g0", "train/e2/p7_g1"]
