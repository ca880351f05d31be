"""GRPO's DAPO options and estimators end to end on the embedded tiny model: dynamic sampling that
really refills (``batch_multiplier = 1``, a first generation batch dropped whole), ``max_num_epochs``
ending the run, GDPO on the arithmetic environment's reward components, REINFORCE++ with the KL in
the reward. Validation is off where it is not the subject, to keep each run to seconds."""

from __future__ import annotations

import math

import pytest
import torch

from rlplane.config.loading import load_config
from rlplane.recipes.grpo import train
from rlplane.runtime.groups import LocalGroup
from rlplane.training import Session
from rlplane.utils.logging import read_metrics
from rlplane.workers.policy import ClippedPGLoss, PolicyWorker

P, G = 4, 4
FAST = [
    f"grpo.num_prompts_per_step={P}",
    f"grpo.num_generations_per_prompt={G}",
    f"policy.train_global_batch_size={P * G}",
    f"policy.train_micro_batch_size={P * G}",
    f"policy.logprob_batch_size={P * G}",
    "policy.generation.max_new_tokens=3",
    "policy.max_total_sequence_length=12",
    "grpo.val_at_start=false",
    "grpo.val_period=0",
    "grpo.val_at_end=false",
    "grpo.max_val_samples=8",
    "grpo.val_batch_size=8",
    "warmup.enabled=false",
    "checkpointing.enabled=false",
    "logger.progress_bar=false",
    "logger.tensorboard_enabled=false",
]


class FirstBatchSaturatedEnv:
    """Reward 0 for every sample of the first ``step`` call (the whole first generation batch has
    all-equal groups and is dropped), then 1 for the first generation of each group of G and 0 for
    the others (every group mixed), so the refill path runs on a known schedule."""

    def __init__(self):
        self.calls = 0

    def step(self, message_logs, metadata):
        from rlplane.envs import EnvironmentReturn

        self.calls += 1
        n = len(message_logs)
        rewards = torch.zeros(n) if self.calls == 1 else (torch.arange(n) % G == 0).float()
        return EnvironmentReturn([{}] * n, [None] * n, [None] * n, rewards, torch.ones(n, dtype=torch.bool), None)


@pytest.fixture
def saturated_env():
    from rlplane.envs import ENV_REGISTRY, register_env

    saved = dict(ENV_REGISTRY)
    register_env("arithmetic", FirstBatchSaturatedEnv)
    yield
    ENV_REGISTRY.clear()
    ENV_REGISTRY.update(saved)


@pytest.fixture
def trained_sizes(monkeypatch):
    """The number of samples each ``train`` call of the policy workers receives."""
    sizes = []
    real = LocalGroup.run_sharded

    def spy(self, method, meta, batch_size=None, **kwargs):
        if method.__name__ == "train":
            sizes.append(len(meta))
        return real(self, method, meta, batch_size, **kwargs)

    monkeypatch.setattr(LocalGroup, "run_sharded", spy)
    return sizes


def test_dynamic_sampling_refills_after_a_first_batch_dropped_whole(tmp_path, saturated_env, trained_sizes):
    cfg = load_config(None, [*FAST, f"run_dir={tmp_path}", "grpo.max_num_steps=3", "grpo.use_dynamic_sampling=true",
                             "grpo.batch_multiplier=1"])
    train(cfg, quiet=True)
    rows = [r for r in read_metrics(tmp_path / "logs") if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert trained_sizes == [P * G] * 3  # exactly prompts × generations, every step
    # Step 1: batch 1 dropped whole (all-equal), batch 2 fills the target; later steps need one batch.
    assert [r["train/dynamic_sampling_num_gen_batches"] for r in rows] == [2, 1, 1]
    assert [r["train/dynamic_sampling_num_discarded_valid_samples"] for r in rows] == [0, 0, 0]
    assert all(r["train/num_samples"] == P * G and r["train/global_valid_seqs"] == P * G for r in rows)
    # train/reward: the raw mean over every generation batch of the step (NeMo RL's pending_unfiltered_rewards):
    # batch 1 all 0, batch 2 1/G, same size -> (0 + 1/G) / 2; filtered_reward: what was trained, 1/G.
    assert rows[0]["train/reward"] == 1 / (2 * G) and rows[0]["train/filtered_reward"] == 1 / G
    assert all(math.isfinite(r["train/loss"]) for r in rows)


def test_max_num_epochs_ends_the_run_when_the_data_is_used_up(tmp_path, first_digit_env):
    # 8 prompts, 4 per step: 2 batches per epoch, 2 epochs -> 4 steps, not max_num_steps = 50.
    cfg = load_config(None, [*FAST, f"run_dir={tmp_path}", "data.num_train_samples=8", "grpo.max_num_epochs=2",
                             "grpo.max_num_steps=50", "grpo.val_at_end=true", "checkpointing.enabled=true",
                             "checkpointing.save_period=100"])
    summary = train(cfg, quiet=True)
    rows = [r for r in read_metrics(tmp_path / "logs") if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert "validation/accuracy" in rows[-1] and summary["accuracy_after"] is not None
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_4"]


def test_data_running_out_during_dynamic_sampling_ends_the_run_after_the_last_full_step(tmp_path, saturated_env,
                                                                                       trained_sizes):
    # 8 prompts, 4 per batch, one epoch: step 1 uses both batches (the first is dropped whole);
    # step 2 finds no data left and the run ends after step 1, with its validation and checkpoint.
    cfg = load_config(None, [*FAST, f"run_dir={tmp_path}", "data.num_train_samples=8", "grpo.max_num_epochs=1",
                             "grpo.max_num_steps=50", "grpo.use_dynamic_sampling=true", "grpo.val_at_end=true",
                             "checkpointing.enabled=true", "checkpointing.save_period=100"])
    summary = train(cfg, quiet=True)
    rows = read_metrics(tmp_path / "logs")
    assert [r["step"] for r in rows] == [1, 1]  # the step, then its end-of-run validation
    assert "validation/accuracy" in rows[1] and summary["accuracy_after"] is not None
    assert trained_sizes == [P * G]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_1"]


def test_gdpo_trains_on_the_arithmetic_reward_components(tmp_path):
    from rlplane.algorithms import gdpo_advantages
    from rlplane.recipes.grpo import TRAIN_COLUMNS, grpo_step
    from rlplane.training import Timer
    from rlplane.training.advantages import estimator_advantages
    from rlplane.training.rollouts import TRAIN_PARTITION, collect_rollouts

    cfg = load_config(None, [*FAST, f"run_dir={tmp_path}", "grpo.adv_estimator.name=gdpo",
                             "grpo.adv_estimator.reward_weights=[2.0, 1.0]", "warmup.enabled=true",
                             "warmup.num_steps=20", "warmup.target_accuracy=null", "warmup.eval_every=20",
                             "warmup.eval_samples=8"])
    s = Session(cfg, quiet=True)
    try:
        s.start()
        loss = ClippedPGLoss(cfg.loss_fn.options(), reference=s.plan.needs_reference)
        s.data_plane.register_partition(TRAIN_PARTITION, TRAIN_COLUMNS, P * G)
        meta, carry = collect_rollouts(s, Timer(), {})
        assert {"reward/correct", "reward/format"} <= set(carry)
        assert torch.equal(carry["reward/correct"], carry["rewards"])
        rows, _ = estimator_advantages(s, meta, carry, torch.ones(P * G))
        expected = gdpo_advantages(carry["group"],
                                   {"correct": carry["reward/correct"], "format": carry["reward/format"]},
                                   reward_weights=[2.0, 1.0])
        assert torch.equal(torch.stack([r[0] for r in rows]), expected)
        s.data_plane.clear_samples(None, TRAIN_PARTITION)
        before = {k: v.clone() for k, v in s.workers.policy.workers[0].model.named_parameters()}
        out = grpo_step(s, loss, 0)
        assert math.isfinite(out["train/loss"])
        after = dict(s.workers.policy.workers[0].model.named_parameters())
        if out["train/advantages/max"] != out["train/advantages/min"]:
            assert any(not torch.equal(before[k], after[k]) for k in before)
    finally:
        s.close()


def test_reinforce_plus_plus_with_kl_in_reward_whitens_over_trained_tokens(tmp_path, first_digit_env):
    from rlplane.algorithms import KLInReward, reinforce_plus_plus_advantages
    from rlplane.recipes.grpo import TRAIN_COLUMNS, grpo_step
    from rlplane.training import Timer
    from rlplane.training.advantages import estimator_advantages
    from rlplane.training.rollouts import TRAIN_PARTITION, collect_rollouts, stamp_sample_mask

    cfg = load_config(None, [*FAST, f"run_dir={tmp_path}", "grpo.adv_estimator.name=reinforce_plus_plus",
                             "loss_fn.use_kl_in_reward=true", "loss_fn.reference_policy_kl_penalty=0.05"])
    s = Session(cfg, quiet=True)
    try:
        s.start()
        loss = ClippedPGLoss(cfg.loss_fn.options(), reference=s.plan.needs_reference)
        grpo_step(s, loss, 0)  # the policy moves off the reference: the KL term is non-zero
        s.data_plane.register_partition(TRAIN_PARTITION, TRAIN_COLUMNS, P * G)
        metrics = {}
        meta, carry = collect_rollouts(s, Timer(), metrics)
        meta, sample_mask = stamp_sample_mask(cfg.grpo.overlong_filtering, meta, carry)
        s.workers.policy.run_sharded(PolicyWorker.compute_logprobs, meta, out_field="prev_logprobs")
        s.workers.policy.run_sharded(PolicyWorker.compute_logprobs, meta, out_field="reference_policy_logprobs",
                                     reference=True)
        rows, adv_metrics = estimator_advantages(s, meta, carry, sample_mask)
        cols = s.data_plane.get_samples(meta, TRAIN_PARTITION,
                                        ["token_mask", "prev_logprobs", "reference_policy_logprobs"])
        mask = cols["token_mask"].float()
        expected = reinforce_plus_plus_advantages(
            carry["group"], carry["rewards"], mask, kl_in_reward=KLInReward(0.05),
            prev_logprobs=cols["prev_logprobs"],
            reference_logprobs=cols["reference_policy_logprobs"])
        for i, row in enumerate(rows):
            torch.testing.assert_close(row, expected[i, : len(row)])
        on = torch.cat([r[m[: len(r)] != 0] for r, m in zip(rows, mask)])
        assert abs(float(on.mean())) < 1e-4  # whitened over the trained tokens
        s.data_plane.clear_samples(None, TRAIN_PARTITION)
        out = grpo_step(s, loss, 1)
        assert math.isfinite(out["train/loss"]) and out["train/kl_penalty"] == 0.0  # KL is in the reward, not the loss
    finally:
        s.close()
