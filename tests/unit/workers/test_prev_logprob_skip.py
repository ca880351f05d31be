"""No forward pass whose result is already known: with one optimizer step per rollout the
old-policy logprobs are the training forward's, detached, so no separate prev-logprob forward runs,
and the step's loss, gradients and every metric are those of the explicit prev forward."""

from __future__ import annotations

import copy

import pytest
import torch

from rlplane.config.loading import load_config
from rlplane.dataplane import make_data_plane
from rlplane.generation import HFGenerationBackend
from rlplane.recipes.grpo import TRAIN_COLUMNS as TRAIN_FIELDS
from rlplane.training import Session
from rlplane.training.plan import policy_options, prev_logprobs_are_the_training_forward, skips_prev_logprob_forward
from rlplane.workers.policy import ClippedPGLoss, PolicyWorker
from tests.tiny import tiny_cfg

N = 16  # 4 prompts x 4 generations: one global batch of 16 = one optimizer step per rollout
ONE_STEP = ["warmup.enabled=false", "grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=4",
            f"policy.train_global_batch_size={N}", "policy.train_micro_batch_size=8", "policy.logprob_batch_size=8",
            "policy.generation.max_new_tokens=12"]


@pytest.mark.parametrize("extra, expected", [
    ([], True),                                                   # the default job's shape: 16 = 4 x 4
    (["policy.train_global_batch_size=8"], False),                # two optimizer steps: π_old ≠ π after the first
    (["grpo.seq_logprob_error_threshold=2.0"], False),            # the driver reads prev before training
    (["policy.lora.enabled=true", "policy.lora.dropout=0.1"], False),  # train-mode forward ≠ eval-mode forward
    (["policy.lora.enabled=true"], True),                         # LoRA without dropout is fine
    (["grpo.use_dynamic_sampling=true"], True),                   # refills to the same 16 samples
    (["loss_fn.use_importance_sampling_correction=true"], True),  # IS weights π_old/π_gen from the training forward
])
def test_decision_grpo(extra, expected):
    assert prev_logprobs_are_the_training_forward(load_config(None, [*ONE_STEP, *extra])) is expected


def test_decision_ppo_needs_one_epoch_and_no_kl_in_reward():
    base = ["policy.train_global_batch_size=256"]  # ppo_arithmetic: 32 prompts x 8 generations per step
    assert prev_logprobs_are_the_training_forward(load_config("ppo_arithmetic", [*base, "ppo.ppo_epochs=1"]))
    assert not prev_logprobs_are_the_training_forward(load_config("ppo_arithmetic", [*base, "ppo.ppo_epochs=2"]))
    kl = ["ppo.ppo_epochs=1", "loss_fn.use_kl_in_reward=true", "loss_fn.reference_policy_kl_penalty=0.01"]
    assert not prev_logprobs_are_the_training_forward(load_config("ppo_arithmetic", [*base, *kl]))
    # The user's force_on_policy_ratio skips it whatever the shape says.
    forced = load_config(None, [*ONE_STEP, "loss_fn.force_on_policy_ratio=true"])
    assert skips_prev_logprob_forward(forced)


def _on_policy_batch(worker: PolicyWorker, cfg, seed=0):
    """Sequences sampled from a copy of the worker's weights, with generation logprobs and advantages."""
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


def _grads(worker):
    return {n: p.grad.clone() for n, p in worker.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("extra", [[], ["loss_fn.use_importance_sampling_correction=true",
                                        "loss_fn.truncated_importance_sampling_ratio=2.0",
                                        "loss_fn.truncated_importance_sampling_type=tis"],
                                   ["policy.generation.top_p=0.8", "loss_fn.ratio_clip_c=3.0"]])
def test_skip_gives_the_explicit_forwards_loss_gradients_and_metrics(extra):
    cfg = load_config(None, [*ONE_STEP, *extra])
    assert skips_prev_logprob_forward(cfg)
    dp = make_data_plane("memory")
    skip = PolicyWorker(policy_options(cfg), dp)
    explicit = PolicyWorker(policy_options(cfg), dp, init_state=copy.deepcopy(skip.model.state_dict()))
    meta = _on_policy_batch(skip, cfg)
    reference = cfg.loss_fn.reference_policy_kl_penalty != 0

    skip_loss = ClippedPGLoss(cfg.loss_fn.options(), reference=reference, prev_from_forward=True)
    m_skip = skip.train(meta, skip_loss)  # never reads prev_logprobs: none are in the data plane yet
    g_skip = _grads(skip)

    explicit.compute_logprobs(meta, out_field="prev_logprobs")
    m_explicit = explicit.train(meta, ClippedPGLoss(cfg.loss_fn.options(), reference=reference))
    g_explicit = _grads(explicit)

    assert m_skip.keys() == m_explicit.keys()
    for k in m_skip:  # loss, actor_loss, token_mult_prob_error, sampling_importance_ratio, clip fractions, grad_norm...
        assert m_skip[k] == pytest.approx(m_explicit[k], rel=1e-5, abs=1e-6), k
    assert g_skip.keys() == g_explicit.keys() and len(g_skip) > 0
    for n in g_skip:
        torch.testing.assert_close(g_skip[n], g_explicit[n], rtol=1e-4, atol=1e-6, msg=n)
    # The weights after the AdamW step agree too (the state the next rollout samples from).
    for (n, a), b in zip(skip.model.state_dict().items(), explicit.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=n)


def _count_prev_forwards(tmp_path, *extra) -> int:
    from rlplane.recipes.grpo import grpo_step

    cfg = tiny_cfg(tmp_path, *ONE_STEP, "checkpointing.enabled=false", *extra)
    with Session(cfg, quiet=True) as s:
        s.start()
        loss = ClippedPGLoss(cfg.loss_fn.options(), reference=s.plan.needs_reference,
                             prev_from_forward=skips_prev_logprob_forward(cfg))  # as recipes/grpo.py's train()
        worker, calls = s.workers.policy.workers[0], []
        real = worker.compute_logprobs
        worker.compute_logprobs = lambda meta, out_field="prev_logprobs", reference=False: (
            calls.append(out_field), real(meta, out_field, reference))[1]
        s.begin_step(0)
        metrics = grpo_step(s, loss, 0)
    assert metrics["train/token_mult_prob_error"] == pytest.approx(1.0, abs=1e-3)  # still reported
    return calls.count("prev_logprobs")


def test_grpo_step_runs_the_prev_forward_only_when_needed(tmp_path):
    assert _count_prev_forwards(tmp_path / "a") == 0  # 16 samples, one optimizer step
    assert _count_prev_forwards(tmp_path / "b", "policy.train_global_batch_size=8") == 1  # two steps: needed
