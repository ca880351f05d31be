"""The policy worker's training logprobs use the sampler's distribution (temperature, top-k, top-p).

Issue 16 item 8: generation logprobs are renormalised over the top-k/top-p set, so training-side
logprobs that only divide by the temperature are off by the kept mass on every token and
``token_mult_prob_error`` sits above 1 even when the trainer's weights are the sampler's.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from rlplane.dataplane import make_data_plane
from rlplane.generation import HFGenerationBackend
from rlplane.recipes.grpo import TRAIN_COLUMNS as TRAIN_FIELDS
from rlplane.training.plan import policy_options
from rlplane.workers.logprobs import token_logprobs
from rlplane.workers.policy import ClippedPGLoss, PolicyWorker
from tests.tiny import worker_cfg

N = 16  # sequences: one global batch


_cfg = functools.partial(worker_cfg, 4, 4, "policy.generation.max_new_tokens=12", micro=8, logprob=8)  # N samples


def _on_policy_batch(worker: PolicyWorker, cfg, seed=0):
    """Sequences sampled from a copy of the worker's own weights, with their generation logprobs."""
    gen = cfg.policy.generation
    g = torch.Generator().manual_seed(seed)
    prompts = [[1] + torch.randint(4, 21, (5,), generator=g).tolist() for _ in range(N)]
    backend = HFGenerationBackend(copy.deepcopy(worker.model), worker.tokenizer)
    out = backend.generate(prompts, max_new_tokens=gen.max_new_tokens, temperature=gen.temperature,
                           top_k=gen.top_k, top_p=gen.top_p, generator=g)
    ids = [torch.tensor(p + o) for p, o in zip(prompts, out.output_ids)]
    mask = [torch.tensor([0] * len(p) + [1] * len(o), dtype=torch.int8) for p, o in zip(prompts, out.output_ids)]
    gen_lp = [torch.cat([torch.zeros(len(p)), lp]) for p, lp in zip(prompts, out.logprobs)]
    adv = torch.randn(N, generator=g)
    worker.dp_rank.dp.register_partition("train", TRAIN_FIELDS, N)
    return worker.dp_rank.dp.put_samples(
        [f"s{i}_g0" for i in range(N)], "train",
        {"input_ids": ids, "token_mask": mask, "generation_logprobs": gen_lp,
         "advantages": [adv[i].expand(len(x)).clone() for i, x in enumerate(ids)]},
    )


@pytest.mark.parametrize("sampling", [["policy.generation.top_p=0.8"], ["policy.generation.top_k=5"],
                                      ["policy.generation.top_k=5", "policy.generation.top_p=0.8",
                                       "policy.generation.temperature=0.7"]])
def test_first_step_is_on_policy_under_top_k_top_p(sampling):
    cfg = _cfg(*sampling)
    worker = PolicyWorker(policy_options(cfg), make_data_plane("memory"))
    meta = _on_policy_batch(worker, cfg)
    worker.compute_logprobs(meta, out_field="prev_logprobs")
    metrics = worker.train(meta, ClippedPGLoss(cfg.loss_fn.options(), reference=worker.reference is not None))
    # Before the fix the trainer's logprobs lacked the -log(kept mass) term: the error was 1.221
    # (top_p 0.8), 2.709 (top_k 5), 2.570 (both at temperature 0.7) on this batch; now 1.000000.
    assert metrics["token_mult_prob_error"] <= 1.001, metrics["token_mult_prob_error"]
    assert metrics["token_mult_prob_error"] >= 1.0 - 1e-6  # a mean of exp(|d|) >= 1, up to float32 rounding


def test_reference_logprobs_stay_unfiltered_and_kl_uses_unfiltered_current():
    """As NeMo RL: reference logprobs are temperature-only; at step 0 (policy == reference) the KL
    term compares the policy's unfiltered logprobs with them and is exactly 0."""
    cfg = _cfg("policy.generation.top_p=0.8", "loss_fn.reference_policy_kl_penalty=0.1")
    worker = PolicyWorker(policy_options(cfg), make_data_plane("memory"))
    meta = _on_policy_batch(worker, cfg, seed=1)
    worker.compute_logprobs(meta, out_field="prev_logprobs")
    worker.compute_logprobs(meta, out_field="reference_policy_logprobs", reference=True)
    data = worker.dp_rank.dp.get_samples(meta, "train", ["input_ids", "prev_logprobs", "reference_policy_logprobs"])
    ids, lengths = data["input_ids"], torch.tensor(meta.seq_lens)
    attn = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
    with torch.no_grad():
        plain = token_logprobs(worker.reference.model.eval(), ids, attn, temperature=1.0)
    valid = attn.bool()
    torch.testing.assert_close(data["reference_policy_logprobs"][valid], plain[valid])
    # The policy's filtered logprobs are renormalised: higher than the unfiltered ones (kept mass < 1).
    assert bool((data["prev_logprobs"][:, 1:][valid[:, 1:]] >= plain[:, 1:][valid[:, 1:]] - 1e-6).all())
    assert bool((data["prev_logprobs"][:, 1:][valid[:, 1:]] > plain[:, 1:][valid[:, 1:]] + 1e-3).any())
    metrics = worker.train(meta, ClippedPGLoss(cfg.loss_fn.options(), reference=worker.reference is not None))
    assert metrics["kl_penalty"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["token_mult_prob_error"] <= 1.001
