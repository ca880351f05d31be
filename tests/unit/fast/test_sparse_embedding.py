"""A large tied embedding trains with a sparse gradient: the same step as the dense twin, and only where it is safe
(tied, trained, large, not under FSDP, switch on)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlplane.config.loading import load_config
from rlplane.fast import sparse_embedding as se
from rlplane.workers import parallel, trainer as trainer_module
from rlplane.workers.packing import MicroBatch
from rlplane.workers.rank import DPRank

VOCAB, HIDDEN = 4096, 256  # 4096 x 256 = 1,048,576 = MIN_ELEMENTS: the smallest embedding that goes sparse


def _model(vocab: int = VOCAB, tied: bool = True) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                                        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                                        tie_word_embeddings=tied))


def _trainer(model) -> trainer_module.Trainer:
    cfg = load_config(None, [])
    return trainer_module.Trainer(model, cfg.policy.optimizer, cfg.policy.scheduler,
                                  DPRank("test", cfg.policy, None, rank=0, world_size=1, shared_paths=None))


def _step(monkeypatch, switch: str) -> tuple[dict[str, torch.Tensor], bool]:
    """One optimizer step over 3 micro-batches (rows repeat tokens: duplicate rows are summed); the weights after
    it and whether the embedding went sparse."""
    monkeypatch.setenv("RLPLANE_SPARSE_EMBEDDING_GRAD", switch)
    model = _model()
    tr = _trainer(model)
    ids = torch.randint(0, 64, (6, 12), generator=torch.Generator().manual_seed(1))  # 64 of 4096 rows touched
    mask = torch.ones(6, 11)

    def forward(mb):
        logits = model(input_ids=ids[mb.rows]).logits[:, :-1]
        return torch.log_softmax(logits, -1).gather(-1, ids[mb.rows, 1:, None]).squeeze(-1)

    def loss(lp, batch, sample_mask, global_toks, _seqs):
        return -(lp * batch["mask"]).sum() / global_toks, {}

    tr.train_global_batches(mask, torch.ones(6), 6, lambda rows: [MicroBatch(r) for r in rows.split(2)], 1.0,
                            forward, loss, {"mask": mask})
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, tr.sparse_embedding


def test_sparse_step_matches_the_dense_twin(monkeypatch):
    sparse, went_sparse = _step(monkeypatch, "1")
    dense, stayed_dense = _step(monkeypatch, "0")
    assert went_sparse and not stayed_dense
    for k in dense:
        torch.testing.assert_close(sparse[k], dense[k], rtol=0, atol=1e-6)
    # The step moved the embedding (the dense twin's rows) and the sparse path moved the same ones.
    assert not torch.equal(dense["model.embed_tokens.weight"], _model().model.embed_tokens.weight)


@pytest.mark.parametrize("case", ["untied", "small", "frozen", "switch off", "no embeddings"])
def test_left_dense_where_it_does_not_apply(monkeypatch, case):
    model = {"untied": lambda: _model(tied=False), "small": lambda: _model(vocab=VOCAB - 1),
             "no embeddings": lambda: torch.nn.Linear(2, 2)}.get(case, _model)()
    if case == "frozen":
        model.get_input_embeddings().weight.requires_grad_(False)
    if case == "switch off":
        monkeypatch.setenv("RLPLANE_SPARSE_EMBEDDING_GRAD", "off")
    assert se.sparse_embedding_grad(model) is False
    if hasattr(model, "get_input_embeddings"):
        assert model.get_input_embeddings().sparse is False


def test_a_backward_that_missed_the_head_is_made_dense():
    model = _model()
    assert se.sparse_embedding_grad(model)
    ids = torch.tensor([[5, 7, 5]])
    model.get_input_embeddings()(ids).sum().backward()  # the embedding alone: a sparse .grad
    weight = model.get_input_embeddings().weight
    assert weight.grad.is_sparse
    se.densify_embedding_grad(model)
    expected = torch.zeros(VOCAB, HIDDEN)
    expected[5], expected[7] = 2.0, 1.0  # token 5 twice, 7 once: d(sum)/d(row) counts its uses
    assert not weight.grad.is_sparse and torch.equal(weight.grad, expected)


def test_fsdp_sharding_turns_it_back_to_dense(monkeypatch):
    monkeypatch.setattr(parallel, "shard_model", lambda *a, **k: None)
    monkeypatch.setattr(parallel, "rebuild_optimizer", lambda model, opt, sch: (opt, sch))
    model = _model()
    tr = _trainer(model)
    assert tr.sparse_embedding and model.get_input_embeddings().sparse
    tr.shard([])
    assert not tr.sparse_embedding and not model.get_input_embeddings().sparse
