"""Sequence packing and dynamic batching (issue 19, NeMo RL's ``policy.sequence_packing`` /
``policy.dynamic_batching``): the plans cut as computed by hand, and on the embedded model packed and
token-budget micro-batches give the padded path's per-token logprobs, loss and gradients, on a mixed-length
batch with a length-1 response, a sample whose tokens are all masked and one whose sample_mask is 0.
"""

from __future__ import annotations

import functools

import pytest
import torch

from rlplane.config.loading import load_config
from rlplane.dataplane import make_data_plane
from rlplane.recipes.grpo import TRAIN_COLUMNS
from rlplane.training.plan import policy_options, value_options
from rlplane.workers.packing import (
    first_fit_decreasing,
    pack_inputs,
    packed_microbatches,
    token_budget_microbatches,
)
from rlplane.workers.policy import ClippedPGLoss, PolicyWorker
from tests.tiny import worker_cfg

LENGTHS = torch.tensor([5, 9, 3, 9, 2, 7])


def test_token_budget_plan_by_hand():
    # Sorted longest first (stable): rows 1 (9), 3 (9), 5 (7), 0 (5), 2 (3), 4 (2). Budget 20, cost = rows × longest:
    # [1, 3] = 2·9 = 18, adding 5 would make 3·9 = 27 > 20; [5, 0] = 2·7 = 14, adding 2 gives 3·7 = 21 > 20;
    # [2, 4] = 2·3 = 6. Padded tokens 18 + 14 + 6 = 38 against 6·9 = 54 for one batch padded to 9.
    plan = token_budget_microbatches(torch.arange(6), LENGTHS, 20)
    assert [mb.rows.tolist() for mb in plan] == [[1, 3], [5, 0], [2, 4]]
    assert all(mb.packing is None for mb in plan)
    # A budget below the longest sequence still places it, alone.
    assert [mb.rows.tolist() for mb in token_budget_microbatches(torch.arange(6), LENGTHS, 4)] == [[1], [3], [5], [0],
                                                                                                   [2], [4]]


def test_first_fit_decreasing_and_packed_plan_by_hand():
    # Width 9 (the longest). Longest first: 1 (9) opens A, full; 3 (9) opens B, full; 5 (7) opens C (2 left);
    # 0 (5) does not fit C (5 > 2), opens D (4 left); 2 (3) fits D (3 <= 4, 1 left); 4 (2) fits C (2 <= 2, 0 left).
    assert first_fit_decreasing(torch.arange(6), LENGTHS, 9) == [[1], [3], [5, 4], [0, 2]]
    # Budget 18 → 18 // 9 = 2 packed rows per micro-batch: rows A, B, then C, D.
    plan = packed_microbatches(torch.arange(6), LENGTHS, 18)
    assert [mb.rows.tolist() for mb in plan] == [[1, 3], [5, 4, 0, 2]]
    second = plan[1].packing
    assert (second.num_rows, second.width) == (2, 9)
    assert second.row.tolist() == [0, 0, 1, 1] and second.offset.tolist() == [0, 7, 0, 5]


def test_pack_inputs_restarts_positions_per_sequence():
    ids = torch.arange(1, 10).repeat(6, 1) + 10 * torch.arange(6)[:, None]  # row i holds 10i+1 .. 10i+9
    mb = packed_microbatches(torch.arange(6), LENGTHS, 18)[1]  # rows [5 | 4] and [0 | 2], width 9
    packed, positions, where = pack_inputs(ids, LENGTHS, mb)
    assert packed.tolist() == [[51, 52, 53, 54, 55, 56, 57, 41, 42], [1, 2, 3, 4, 5, 21, 22, 23, 0]]
    # Row 2's last column is a tail: it counts from 0 again, a block of its own.
    assert positions.tolist() == [[0, 1, 2, 3, 4, 5, 6, 0, 1], [0, 1, 2, 3, 4, 0, 1, 2, 0]]
    # where: flat index row·9 + column of each sample's token t (t < 7, the longest of the micro-batch); past a
    # sample's length it points at its row's column 0.
    assert where[1].tolist() == [7, 8, 0, 0, 0, 0, 0]  # sample 4 (length 2) at row 0, columns 7-8
    assert where[3].tolist() == [14, 15, 16, 9, 9, 9, 9]  # sample 2 (length 3) at row 1 (9 + 5 ...)


# ---- the worker: packed / token-budget against padded ----------------------------------------------------------
N = 12
# Prompt, response lengths. Sample 0 has a length-1 response; sample 5's tokens are all masked (token_mask 0);
# sample 8 has sample_mask 0 (a tag); lengths 2 .. 24 so padding is most of the padded batch.
PROMPTS = [4, 6, 3, 5, 7, 4, 2, 6, 3, 5, 4, 1]
RESPONSES = [1, 11, 6, 19, 2, 8, 22, 3, 12, 5, 16, 1]


_cfg = functools.partial(worker_cfg, 3, 4, "policy.max_total_sequence_length=32", "policy.generation.max_new_tokens=24",
                         "policy.max_grad_norm=null", micro=4, logprob=4)  # N samples


def _batch(client, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = [p + r for p, r in zip(PROMPTS, RESPONSES)]
    ids = [torch.randint(4, 21, (n,), generator=g) for n in lengths]
    mask = [torch.cat([torch.zeros(p), torch.ones(r)]).to(torch.int8) for p, r in zip(PROMPTS, RESPONSES)]
    mask[5].zero_()
    adv = torch.randn(N, generator=g)
    client.register_partition("train", TRAIN_COLUMNS, N)
    meta = client.put_samples(
        [f"s{i}_g0" for i in range(N)], "train",
        {"input_ids": ids, "token_mask": mask,
         # Off-policy generation logprobs, so the ratio terms and token_mult_prob_error are not trivial.
         "generation_logprobs": [-3.0 + 0.3 * torch.randn(n, generator=g) for n in lengths],
         "advantages": [adv[i].expand(n).clone() for i, n in enumerate(lengths)]},
    )
    return meta.stamp_tags({"sample_mask": [0.0 if i == 8 else 1.0 for i in range(N)]})


MODES = {
    "padded": [],
    "dynamic": ["policy.dynamic_batching.enabled=true", "policy.dynamic_batching.train_mb_tokens=64",
                "policy.dynamic_batching.logprob_mb_tokens=48"],
    "packed": ["policy.sequence_packing.enabled=true", "policy.sequence_packing.train_mb_tokens=64",
               "policy.sequence_packing.logprob_mb_tokens=48"],
    # Rows of 40 columns: up to 6 short sequences share one.
    "packed, wide rows": ["policy.sequence_packing.enabled=true", "policy.sequence_packing.row_tokens=40",
                          "policy.sequence_packing.train_mb_tokens=80"],
    # One micro-batch holding the whole global batch, packed: the micro-batch split itself changes nothing.
    "packed, one micro-batch": ["policy.sequence_packing.enabled=true",
                                "policy.sequence_packing.train_mb_tokens=1024"],
    "dynamic, tiny budget": ["policy.dynamic_batching.enabled=true", "policy.dynamic_batching.train_mb_tokens=32",
                             "policy.dynamic_batching.logprob_mb_tokens=32"],
}


def _logprobs_loss_grads(extra, token_level, prev=None):
    """Per-token logprobs (B, T) from compute_logprobs, then one train step's metrics and gradients (with
    ``prev``, (B, T), as the prev logprobs, so every mode trains on the same ones)."""
    cfg = _cfg(*extra, f"loss_fn.token_level_loss={str(token_level).lower()}")
    worker = PolicyWorker(policy_options(cfg), make_data_plane("memory"))
    meta = _batch(worker.dp_rank.dp)
    worker.compute_logprobs(meta, out_field="prev_logprobs")
    lp = worker.dp_rank.dp.get_samples(meta, "train", ["prev_logprobs"])["prev_logprobs"]
    if prev is not None:
        worker.dp_rank.dp.put_samples(list(meta.sample_ids), "train",
                              {"prev_logprobs": [x[:n] for x, n in zip(prev, meta.seq_lens)]})
    metrics = worker.train(meta, ClippedPGLoss(cfg.loss_fn.options(), reference=False))
    # max_grad_norm = null: .grad is the unclipped gradient of the step (AdamW does not clear it).
    grads = {n: p.grad.clone() for n, p in worker.model.named_parameters()}
    return lp, metrics, grads, torch.tensor(meta.seq_lens)


@pytest.mark.parametrize("token_level", [True, False], ids=["token-mean", "sequence-mean"])
def test_packed_and_token_budget_batches_match_padded(token_level):
    prev, *_ = _logprobs_loss_grads(MODES["padded"], token_level)
    ref_lp, ref_metrics, ref_grads, lengths = _logprobs_loss_grads(MODES["padded"], token_level, prev)
    valid = torch.arange(ref_lp.shape[1])[None, :] < lengths[:, None]  # (B, T)
    assert ref_metrics["loss"] != 0.0 and ref_metrics["token_mult_prob_error"] > 1.0
    for name, extra in MODES.items():
        lp, metrics, grads, _ = _logprobs_loss_grads(extra, token_level, prev)
        torch.testing.assert_close(lp[valid], ref_lp[valid], atol=1e-5, rtol=0, msg=f"{name}: logprobs")
        for key in ("loss", "token_mult_prob_error", "global_valid_toks", "global_valid_seqs", "grad_norm"):
            assert metrics[key] == pytest.approx(ref_metrics[key], rel=1e-5, abs=1e-6), (name, key)
        for pname, g in ref_grads.items():
            torch.testing.assert_close(grads[pname], g, atol=1e-5, rtol=1e-4, msg=f"{name}: grad of {pname}")


@pytest.mark.parametrize("extra", [MODES["dynamic"], MODES["packed"]], ids=["dynamic", "packed"])
def test_value_worker_packed_and_token_budget_match_padded(extra):
    """The critic takes the same micro-batch plans: same V(s_t), same value loss and gradients."""
    from rlplane.recipes.ppo import TRAIN_COLUMNS as PPO_COLUMNS
    from rlplane.workers.value import ValueWorker

    def run(modes):
        cfg = load_config("ppo_arithmetic", [
            "warmup.enabled=false", f"policy.train_global_batch_size={N}", "policy.train_micro_batch_size=4",
            "policy.logprob_batch_size=4", "policy.max_total_sequence_length=32",
            "policy.generation.max_new_tokens=24", "ppo.num_prompts_per_step=6", "ppo.num_generations_per_prompt=2",
            "value.max_grad_norm=null", "value.loss_fn.cliprange=0.2", *modes])
        client = make_data_plane("memory")
        g = torch.Generator().manual_seed(3)
        lengths = [p + r for p, r in zip(PROMPTS, RESPONSES)]
        client.register_partition("train", PPO_COLUMNS, N)
        mask = [torch.cat([torch.zeros(p), torch.ones(r)]).to(torch.int8) for p, r in zip(PROMPTS, RESPONSES)]
        meta = client.put_samples([f"s{i}_g0" for i in range(N)], "train", {
            "input_ids": [torch.randint(4, 21, (n,), generator=g) for n in lengths], "token_mask": mask,
            "returns": [torch.randn(n, generator=g) for n in lengths]})
        w = ValueWorker(value_options(cfg), client)
        torch.nn.init.normal_(w.model.score.weight, std=0.1, generator=torch.Generator().manual_seed(2))
        w.compute_values(meta)
        values = client.get_samples(meta, "train", ["values"])["values"]
        metrics = w.train(meta)
        return values, metrics, {n: p.grad.clone() for n, p in w.model.named_parameters()}, torch.tensor(meta.seq_lens)

    ref_v, ref_m, ref_g, lengths = run([])
    v, m, grads, _ = run(extra)
    valid = torch.arange(ref_v.shape[1])[None, :] < lengths[:, None]
    torch.testing.assert_close(v[valid], ref_v[valid], atol=1e-5, rtol=0)
    assert m["loss"] == pytest.approx(ref_m["loss"], rel=1e-5)
    for name, g in ref_g.items():
        torch.testing.assert_close(grads[name], g, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("overrides, message", [
    (["policy.dynamic_batching.enabled=true", "policy.sequence_packing.enabled=true"], "are exclusive"),
    (["policy.sequence_packing.enabled=true", "policy.sequence_packing.train_mb_tokens=16"],
     "policy.sequence_packing.train_mb_tokens = 16 < policy.max_total_sequence_length = 32"),
    (["policy.dynamic_batching.enabled=true", "policy.dynamic_batching.logprob_mb_tokens=8"],
     "policy.dynamic_batching.logprob_mb_tokens = 8 < policy.max_total_sequence_length = 32"),
])
def test_config_errors_name_the_key_and_the_fix(overrides, message):
    with pytest.raises(Exception) as err:
        _cfg(*overrides)
    assert message in str(err.value)
