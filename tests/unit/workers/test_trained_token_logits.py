"""The training forward runs the vocabulary projection only on the tokens the loss reads (issue 19, training
near the limit): logprobs, loss and gradients are the full path's, and the lm_head really sees those rows alone.
"""

from __future__ import annotations

import functools

import pytest
import torch

from rlplane.dataplane import make_data_plane
from rlplane.models.configured import load_configured_policy
from rlplane.recipes.grpo import TRAIN_COLUMNS
from rlplane.training.plan import policy_options
from rlplane.workers import policy
from rlplane.workers.logprobs import microbatch_logprobs
from rlplane.workers.packing import MicroBatch
from rlplane.workers.policy import ClippedPGLoss, PolicyWorker
from tests.tiny import worker_cfg

PROMPTS = [4, 6, 3, 5]
RESPONSES = [3, 5, 6, 2]
N = len(PROMPTS)


_cfg = functools.partial(worker_cfg, 2, 2, "policy.max_total_sequence_length=16", "policy.generation.max_new_tokens=8",
                         "policy.max_grad_norm=null", micro=2, logprob=2)  # N samples


def _batch(seed=0):
    """(ids (B, T) right-padded to T = 11, lengths (B,), token_mask (B, T) on the responses)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([p + r for p, r in zip(PROMPTS, RESPONSES)])  # 7, 11, 9, 7
    ids = torch.randint(4, 21, (N, int(lengths.max())), generator=g)
    t = torch.arange(ids.shape[1])[None, :]
    mask = (t >= torch.tensor(PROMPTS)[:, None]) & (t < lengths[:, None])
    return ids, lengths, mask


@pytest.mark.parametrize("trim", [False, True], ids=["fixed", "trimmed"])
@pytest.mark.parametrize("sampling", [(1.0, None, 1.0), (0.7, 5, 0.9)], ids=["plain", "top-k-top-p"])
def test_skipped_logits_give_the_full_paths_logprobs_and_gradients(trim, sampling):
    temperature, top_k, top_p = sampling
    cfg = _cfg()
    model, _ = load_configured_policy(cfg.policy, cfg.loop.seed, trainable=True)
    ids, lengths, mask = _batch()
    mb = MicroBatch(torch.tensor([2, 0, 3]))  # prompts 3, 4, 5: logits from column 2
    m = mask[mb.rows, 1:].float()  # (b, T-1): the loss's view, aligned with logprobs[:, 1:]
    weights = torch.randn(m.shape, generator=torch.Generator().manual_seed(1))
    seen = []
    hook = model.get_output_embeddings().register_forward_hook(lambda mod, args, out: seen.append(args[0].shape))

    def run(only):
        model.zero_grad(set_to_none=True)
        seen.clear()
        lp, plain = microbatch_logprobs(model, ids, lengths, mb, trim, temperature, top_k, top_p, unfiltered=True,
                                        only=only)  # (b, T) each
        ((lp[:, 1:] * weights * m).sum() + (plain[:, 1:] * m).sum()).backward()
        return lp, plain, {n: p.grad.clone() for n, p in model.named_parameters()}, seen[0]

    lp0, plain0, grads0, shape0 = run(None)
    lp, plain, grads, shape = run(mask[mb.rows])
    hook.remove()
    width = 9 if trim else 11  # the micro-batch's longest (rows 2, 0, 3: 9, 7, 7) or the batch's width
    assert shape0[:2] == (3, width)  # every column of every row
    assert shape[0] == 6 + 3 + 2  # the responses' tokens alone (rows 2, 0, 3), one logits row each
    keep = mask[mb.rows]  # the tokens the loss reads
    for full, skipped in ((lp0, lp), (plain0, plain)):
        assert full.shape == skipped.shape == (3, 11)
        torch.testing.assert_close(skipped[keep], full[keep], atol=1e-6, rtol=0)
        assert bool((skipped[~keep] == 0).all())  # not computed: 0, like column 0
    for name, g in grads0.items():
        torch.testing.assert_close(grads[name], g, atol=1e-6, rtol=1e-5, msg=name)


def _train(monkeypatch, full: bool, extra=()):
    if full:  # the path before: every column's logits
        monkeypatch.setattr(policy, "microbatch_logprobs", lambda *a, only=None, **k: microbatch_logprobs(*a, **k))
    cfg = _cfg(*extra)
    worker = PolicyWorker(policy_options(cfg), make_data_plane("memory"))
    ids, lengths, mask = _batch()
    g = torch.Generator().manual_seed(2)
    worker.dp_rank.dp.register_partition("train", TRAIN_COLUMNS, N)
    meta = worker.dp_rank.dp.put_samples([f"s{i}_g0" for i in range(N)], "train", {
        "input_ids": [ids[i, :n] for i, n in enumerate(lengths)],
        "token_mask": [mask[i, :n].to(torch.int8) for i, n in enumerate(lengths)],
        "generation_logprobs": [-3.0 + 0.3 * torch.randn(int(n), generator=g) for n in lengths],
        "advantages": [torch.full((int(n),), float(torch.randn(1, generator=g))) for n in lengths]})
    worker.compute_logprobs(meta, out_field="prev_logprobs")
    metrics = worker.train(meta, ClippedPGLoss(cfg.loss_fn.options(), reference=False))
    monkeypatch.undo()
    return metrics, {n: p.grad.clone() for n, p in worker.model.named_parameters()}


@pytest.mark.parametrize("extra", [[], ["policy.dynamic_batching.enabled=true",
                                        "policy.dynamic_batching.train_mb_tokens=24"]], ids=["fixed", "dynamic"])
def test_policy_worker_trains_as_with_every_logit(monkeypatch, extra):
    ref_metrics, ref_grads = _train(monkeypatch, full=True, extra=extra)
    metrics, grads = _train(monkeypatch, full=False, extra=extra)
    assert ref_metrics["loss"] != 0.0 and ref_metrics["token_mult_prob_error"] > 1.0
    for key in ("loss", "token_mult_prob_error", "global_valid_toks", "grad_norm"):
        assert metrics[key] == pytest.approx(ref_metrics[key], rel=1e-5, abs=1e-7), key
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, atol=1e-6, rtol=1e-5, msg=name)
