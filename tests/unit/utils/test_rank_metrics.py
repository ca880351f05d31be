"""Per-step metrics: extrema across micro-batches and DP ranks, and the global valid counts of a step."""

import torch

from rlplane.utils.metrics import merge_rank_metrics, reduce_microbatch_metrics
from rlplane.workers.packing import fixed_microbatches
from rlplane.workers.rank import DPRank
from rlplane.workers.trainer import Trainer


def _t(x):
    return torch.tensor(x, dtype=torch.float64)


def test_a_real_minus_one_extremum_survives_the_merge():
    # Rank 0's smallest ratio is exactly -1.0 (a real value); rank 1 has no valid token (+inf/-inf).
    rank0 = reduce_microbatch_metrics([{"r_min": _t(-1.0), "r_max": _t(-1.0), "n": _t(2.0)}])
    rank1 = reduce_microbatch_metrics([{"r_min": _t(float("inf")), "r_max": _t(float("-inf")), "n": _t(0.0)}])
    assert merge_rank_metrics([rank0, rank1]) == {"r_min": -1.0, "r_max": -1.0, "n": 2.0}
    assert merge_rank_metrics([rank1, {"r_min": -0.5, "r_max": -3.0, "n": 1.0}]) == {
        "r_min": -0.5, "r_max": -3.0, "n": 1.0}  # a rank without a value does not win the max either
    # None anywhere: -1 (the documented "no value"), with one rank or several.
    assert merge_rank_metrics([rank1]) == {"r_min": -1.0, "r_max": -1.0, "n": 0.0}
    assert merge_rank_metrics([rank1, rank1])["r_min"] == -1.0


class _Loss:
    def __call__(self, out, batch, sample_mask, global_toks, global_seqs):
        return (out * batch["token_mask"]).sum() / global_toks, {}


def test_global_valid_counts_are_the_mean_over_global_batches():
    # 4 rows, global batch 2: batch 0 has 3 + 2 valid tokens, batch 1 has 1 + 0 (its second row masked).
    w = Trainer.__new__(Trainer)
    w.rank = DPRank.__new__(DPRank)
    w.rank.world_size, w.rank.group = 1, None
    w.model = torch.nn.Linear(1, 1)
    w.optimizer = torch.optim.SGD(w.model.parameters(), lr=0.1)
    w.scheduler = torch.optim.lr_scheduler.LambdaLR(w.optimizer, lambda s: 1.0)
    w.sparse_embedding = False  # what Trainer.__init__ sets for a model without tied embeddings
    token_mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]])
    sample_mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    x = torch.ones(4, 3, 1)
    out = w.train_global_batches(
        token_mask, sample_mask, 2, lambda rows: fixed_microbatches(rows, 1), 1.0,
        lambda mb: w.model(x[mb.rows]).squeeze(-1), _Loss(), {"token_mask": token_mask.float()})
    assert out["global_valid_toks"] == (5 + 1) / 2
    assert out["global_valid_seqs"] == (2 + 1) / 2


def test_nemo_named_extrema_reduce_by_min_and_max():
    # max_*/min_* (NeMo RL's names, e.g. max_seq_mult_prob_error) are extrema like *_max/*_min.
    mb = [{"max_e": _t(2.0), "min_e": _t(1.5), "mean_e": _t(0.5)},
          {"max_e": _t(float("-inf")), "min_e": _t(float("inf")), "mean_e": _t(0.25)}]
    rank0 = reduce_microbatch_metrics(mb)
    assert rank0 == {"max_e": 2.0, "min_e": 1.5, "mean_e": 0.75}
    rank1 = {"max_e": 3.0, "min_e": 1.2, "mean_e": 0.5}
    assert merge_rank_metrics([rank0, rank1]) == {"max_e": 3.0, "min_e": 1.2, "mean_e": 1.25}
