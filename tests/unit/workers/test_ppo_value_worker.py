"""The PPO value worker on the memory data plane: right-shifted values, training toward returns, HF checkpoints."""

from __future__ import annotations

import functools

import torch

from rlplane.dataplane import make_data_plane
from rlplane.models.loading import load_policy
from rlplane.recipes.ppo import TRAIN_COLUMNS as TRAIN_FIELDS
from rlplane.training.plan import value_options
from rlplane.workers.value import ValueWorker, build_value_model, shifted_values
from tests.tiny import worker_cfg

_cfg = functools.partial(worker_cfg, 4, 2, "value.optimizer.lr=1e-2", "value.loss_fn.cliprange=null", micro=4,
                         preset="ppo_arithmetic", loop="ppo")


def _batch(client, n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(6, 12, (n,), generator=g)
    ids = [torch.randint(4, 21, (int(L),), generator=g) for L in lengths]
    mask = [torch.cat([torch.zeros(4), torch.ones(int(L) - 4)]).to(torch.int8) for L in lengths]
    client.register_partition("train", TRAIN_FIELDS, n)
    meta = client.put_samples([f"s{i}_g0" for i in range(n)], "train", {"input_ids": ids, "token_mask": mask})
    return meta, lengths


def test_value_model_is_policy_trunk_with_zero_head():
    cfg = _cfg()
    model, _ = build_value_model(cfg.policy, cfg.loop.seed)
    causal, _ = load_policy(cfg.policy.model_name, seed=cfg.ppo.seed, model_kwargs=cfg.policy.tiny.model_dump())
    for k, v in causal.model.state_dict().items():
        assert torch.equal(model.model.state_dict()[k], v), k
    assert model.config.num_labels == 1 and torch.count_nonzero(model.score.weight) == 0


def test_shifted_values_put_head_output_at_next_position():
    cfg = _cfg()
    model, _ = build_value_model(cfg.policy, cfg.loop.seed)
    torch.nn.init.normal_(model.score.weight, generator=torch.Generator().manual_seed(1))
    ids = torch.tensor([[1, 5, 6, 17, 8, 9]])
    head = model(input_ids=ids).logits[..., 0]  # (1, T): head at t has seen tokens <= t
    v = shifted_values(model, ids, torch.ones_like(ids))
    assert v[0, 0] == 0  # V(s_0): no state before the first token
    torch.testing.assert_close(v[:, 1:], head[:, :-1])


def test_compute_values_writes_trimmed_column_and_training_fits_returns():
    cfg = _cfg()
    client = make_data_plane("memory")
    meta, lengths = _batch(client)
    w = ValueWorker(value_options(cfg), client)
    torch.nn.init.normal_(w.model.score.weight, std=0.1, generator=torch.Generator().manual_seed(2))
    w.compute_values(meta)
    stored = client.get_samples(meta, "train", ["values", "input_ids"])
    attn = (torch.arange(stored["input_ids"].shape[1])[None] < lengths[:, None]).long()
    expect = shifted_values(w.model, stored["input_ids"], attn)
    torch.testing.assert_close(stored["values"] * attn, expect * attn)
    # Returns of 1 on response tokens: the value loss falls over a few passes.
    client.put_samples(meta, "train", {"returns": [torch.ones(int(L)) for L in lengths]})
    losses = [w.train(meta)["loss"] for _ in range(15)]
    assert losses[-1] < 0.25 * losses[0]


def test_value_checkpoint_is_hf_loadable_and_restores_optimizer(tmp_path):
    from transformers import AutoModelForTokenClassification

    cfg = _cfg()
    client = make_data_plane("memory")
    meta, lengths = _batch(client)
    w = ValueWorker(value_options(cfg), client)
    w.compute_values(meta)
    client.put_samples(meta, "train", {"returns": [torch.ones(int(L)) for L in lengths]})
    w.train(meta)
    w.save(str(tmp_path / "value"))
    hf = AutoModelForTokenClassification.from_pretrained(tmp_path / "value" / "weights")
    ids = torch.tensor([[1, 5, 6, 17]])
    torch.testing.assert_close(hf(input_ids=ids).logits, w.model(input_ids=ids).logits)
    other = ValueWorker(value_options(cfg), client)
    other.load(str(tmp_path / "value"))
    a, b = w.train(meta), other.train(meta)  # same weights and Adam moments: same next step
    assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"]
    for k, v in w.get_weights().items():
        torch.testing.assert_close(other.get_weights()[k], v)
