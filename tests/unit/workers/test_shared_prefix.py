"""``policy.shared_prefix_forward`` (issue 19, the default job's training step): each distinct prompt
computed once, its responses against its keys/values. Against the plain forward on the embedded model:
the same per-token training logprobs, loss, metrics and gradients, for groups sharing prompts of
different lengths, a length-1 response, a sample with no generated token, a sample_mask 0, with
top-k/top-p and a KL term (the unfiltered logprobs), and across micro-batches that split a group.
"""

from __future__ import annotations

import pytest
import torch

from rlplane.config.loading import load_config
from rlplane.dataplane import make_data_plane
from rlplane.recipes.grpo import TRAIN_COLUMNS
from rlplane.training.plan import policy_options
from rlplane.workers import shared_prefix
from rlplane.workers.policy import ClippedPGLoss, PolicyWorker
from tests.tiny import worker_cfg

# 4 prompts x 3 responses: prompt lengths 5, 7, 3, 6; responses of 1 .. 9 tokens; sample 7 generated nothing.
PROMPT_LENS = [5, 7, 3, 6]
RESPONSES = [[4, 1, 6], [2, 9, 3], [5, 0, 8], [3, 3, 7]]
N = 12


def test_prompt_lengths_by_hand():
    lengths = torch.tensor([6, 5, 4])
    # Row 0: prompt of 3, then 3 generated; row 1: prompt of 1, then 4; row 2: nothing generated (prompt = 4).
    mask = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0]])
    assert shared_prefix.prompt_lengths(mask, lengths).tolist() == [3, 1, 4]
    # Multi-turn: an observation (mask 0) between generated tokens.
    turns = torch.tensor([[0, 0, 1, 0, 1, 1], [0, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0]])
    assert shared_prefix.prompt_lengths(turns, lengths) is None
    # A generated token at position 0 has no logits before it: not a prompt-then-response row.
    assert shared_prefix.prompt_lengths(torch.tensor([[1, 1, 0, 0, 0, 0]]), torch.tensor([2])) is None


def _cfg(shared: bool, *extra):
    return worker_cfg(4, 3, "policy.max_total_sequence_length=32", "policy.generation.max_new_tokens=16",
                      "policy.max_grad_norm=null", f"policy.shared_prefix_forward={str(shared).lower()}", *extra)


def _batch(client):
    g = torch.Generator().manual_seed(0)
    ids, mask = [], []
    for p, responses in zip(PROMPT_LENS, RESPONSES):
        prompt = torch.cat([torch.tensor([1]), torch.randint(4, 21, (p - 1,), generator=g)])  # <bos> first
        for r in responses:
            ids.append(torch.cat([prompt, torch.randint(4, 21, (r,), generator=g)]))
            mask.append(torch.cat([torch.zeros(p), torch.ones(r)]).to(torch.int8))
    lengths = [len(x) for x in ids]
    adv = torch.randn(N, generator=g)
    client.register_partition("train", TRAIN_COLUMNS, N)
    meta = client.put_samples(
        [f"s{i}_g0" for i in range(N)], "train",
        {"input_ids": ids, "token_mask": mask,
         "generation_logprobs": [-3.0 + 0.3 * torch.randn(n, generator=g) for n in lengths],
         "prev_logprobs": [-3.0 + 0.3 * torch.randn(n, generator=g) for n in lengths],
         "reference_policy_logprobs": [-3.0 + 0.3 * torch.randn(n, generator=g) for n in lengths],
         "advantages": [adv[i].expand(n).clone() for i, n in enumerate(lengths)]},
    )
    return meta.stamp_tags({"sample_mask": [0.0 if i == 4 else 1.0 for i in range(N)]})


def _train(shared: bool, *extra):
    cfg = _cfg(shared, *extra)
    worker = PolicyWorker(policy_options(cfg), make_data_plane("memory"))
    meta = _batch(worker.dp_rank.dp)
    forwards = []
    original = worker.model.forward
    worker.model.forward = lambda *a, **k: forwards.append(k["input_ids"].shape) or original(*a, **k)
    loss = ClippedPGLoss(cfg.loss_fn.options(), reference=cfg.loss_fn.reference_policy_kl_penalty != 0)
    metrics = worker.train(meta, loss)
    grads = {n: p.grad.clone() for n, p in worker.model.named_parameters()}
    return metrics, grads, forwards


CASES = {
    "one micro-batch": [],
    # 4 rows per micro-batch: groups of 3 are split between micro-batches (rows 3-5 and 6-8 straddle them).
    "micro-batches of 4": ["policy.train_micro_batch_size=4"],
    "top-k, top-p and a KL term": ["policy.generation.top_k=8", "policy.generation.top_p=0.9",
                                   "loss_fn.reference_policy_kl_penalty=0.1"],
    "sequence-mean loss": ["loss_fn.token_level_loss=false"],
    "token budget": ["policy.dynamic_batching.enabled=true", "policy.dynamic_batching.train_mb_tokens=64"],
    # The default job runs eager attention; SDPA takes the right-padded prompts' mask as well.
    "sdpa attention": ["policy.attn_implementation=sdpa"],
}


@pytest.mark.parametrize("extra", CASES.values(), ids=CASES.keys())
def test_shared_prefix_forward_matches_the_plain_one(extra):
    ref_metrics, ref_grads, plain_forwards = _train(False, *extra)
    metrics, grads, forwards = _train(True, *extra)
    assert ref_metrics["loss"] != 0.0 and ref_metrics["token_mult_prob_error"] > 1.0
    # Really the other path: per micro-batch a forward over its distinct prompts, then one over its responses
    # (unless none is longer than 1 token: the prompts' last logits predict them all).
    assert len(plain_forwards) < len(forwards) <= 2 * len(plain_forwards)
    if not extra:
        assert forwards[0] == (4, 7) and forwards[1] == (12, 8)  # 4 prompts (longest 7); responses (longest 9) - 1
    for key, value in ref_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, atol=1e-6, rtol=1e-4, msg=name)


def test_multi_turn_samples_take_the_plain_forward():
    cfg = _cfg(True)
    worker = PolicyWorker(policy_options(cfg), make_data_plane("memory"))
    meta = _batch(worker.dp_rank.dp)
    mask = worker.dp_rank.dp.get_samples(meta, "train", ["token_mask"])["token_mask"]
    mask[0, 6] = 0  # an observation token inside sample 0's response
    worker.dp_rank.dp.put_samples(list(meta.sample_ids), "train",
                                  {"token_mask": [m[:n] for m, n in zip(mask, meta.seq_lens)]})
    forwards = []
    original = worker.model.forward
    worker.model.forward = lambda *a, **k: forwards.append(k["input_ids"].shape) or original(*a, **k)
    worker.train(meta, ClippedPGLoss(cfg.loss_fn.options(), reference=False))
    assert forwards == [(N, 16)]  # one plain forward of the padded batch (longest 7 + 9)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_attn_implementation_reaches_the_model(impl):
    cfg = load_config(None, ["warmup.enabled=false", f"policy.attn_implementation={impl}"])
    assert PolicyWorker(policy_options(cfg), make_data_plane("memory")).model.config._attn_implementation == impl


@pytest.mark.parametrize("extra", [[], ["policy.generation.top_p=0.8"]], ids=["plain sampling", "top-p"])
def test_logprob_forward_matches_the_plain_one_on_every_token(extra):
    """The no-grad prev-logprob forward takes the same path: prompt and response tokens as the plain forward."""
    out = {}
    for shared in (False, True):
        worker = PolicyWorker(policy_options(_cfg(shared, *extra)), make_data_plane("memory"))
        meta = _batch(worker.dp_rank.dp)
        worker.compute_logprobs(meta, out_field="prev_logprobs")
        out[shared] = worker.dp_rank.dp.get_samples(meta, "train", ["prev_logprobs"])["prev_logprobs"]
    lengths = torch.tensor(meta.seq_lens)
    valid = torch.arange(out[False].shape[1])[None, :] < lengths[:, None]
    assert bool((out[False][valid] != 0).sum() == valid.sum() - N)  # every token but each row's first has one
    torch.testing.assert_close(out[True][valid], out[False][valid], atol=1e-5, rtol=0)
    assert bool((out[True][~valid] == 0).all())
