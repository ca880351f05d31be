"""PPO end to end on the embedded tiny model: both runtimes, the values column, both models train, resume."""

from __future__ import annotations

import math

import pytest
import torch

from rlplane.config.loading import load_config
from rlplane.recipes.ppo import TRAIN_COLUMNS, ppo_step, train
from rlplane.training import Session, Timer
from rlplane.training.plan import value_options
from rlplane.training.rollouts import TRAIN_PARTITION, collect_rollouts
from rlplane.utils.logging import read_metrics
from rlplane.workers.policy import ClippedPGLoss
from rlplane.workers.value import ValueWorker, shifted_values

SMALL = [
    "ppo.num_prompts_per_step=8",
    "ppo.num_generations_per_prompt=4",
    "policy.train_global_batch_size=16",   # two optimizer steps per epoch
    "policy.train_micro_batch_size=8",
    "policy.logprob_batch_size=32",
    "ppo.ppo_epochs=2",
    "ppo.policy_training_start_step=0",
    "ppo.max_num_steps=3",
    "ppo.val_period=2",
    "ppo.max_val_samples=32",
    "ppo.val_batch_size=32",
    "warmup.num_steps=30",
    "warmup.target_accuracy=null",
    "warmup.eval_every=30",
    "warmup.eval_samples=16",
    "logger.progress_bar=false",
    "logger.tensorboard_enabled=false",
    "checkpointing.save_period=2",
]
RAY = ["runtime=ray", "data_plane.backend=ray", "policy.dp_size=2"]


def weights(group) -> dict:
    """Rank 0's weights (policy or critic)."""
    return group.run(group.cls.get_weights)[0]


def small_cfg(tmp_path, *extra):
    return load_config("ppo_arithmetic", [*SMALL, f"run_dir={tmp_path}", *extra])


def _timings_free(rows):
    return [{k: v for k, v in r.items() if not k.startswith("timing/")} for r in rows]


@pytest.mark.parametrize("runtime", ["local", pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.slow])])
def test_ppo_steps_write_values_and_train_both_models(tmp_path, first_digit_env, runtime, request):
    extra = RAY if runtime == "ray" else []
    if runtime == "ray":
        request.getfixturevalue("ray_session")
    # The rollout actor of the ray runtime does not see first_digit_env: DAPO overlong shaping on the
    # driver makes rewards vary with the response length (1..4 tokens → 0, −1/3, −2/3, −1) either way.
    shaping = ["ppo.reward_shaping.enabled=true", "ppo.reward_shaping.overlong_buffer_length=3",
               "ppo.reward_shaping.max_response_length=4"]
    s = Session(small_cfg(tmp_path, "warmup.enabled=false", *shaping, *extra), quiet=True)
    try:
        s.start()
        loss = ClippedPGLoss(s.cfg.loss_fn.options(), reference=s.plan.needs_reference)
        # The values column goes worker → data plane, right-shifted, one row per sample, trimmed to its length.
        s.data_plane.register_partition(TRAIN_PARTITION, TRAIN_COLUMNS, 32)
        meta, _ = collect_rollouts(s, Timer(), {})
        s.workers.value.run_sharded(ValueWorker.compute_values, meta)
        cols = s.data_plane.get_samples(meta, TRAIN_PARTITION, ["input_ids", "values"])
        assert cols["values"].shape == cols["input_ids"].shape and (cols["values"][:, 0] == 0).all()
        ref = ValueWorker(value_options(s.cfg), None)
        ref.model.load_state_dict(weights(s.workers.value))
        lengths = torch.tensor(meta.seq_lens)
        attn = (torch.arange(cols["input_ids"].shape[1])[None] < lengths[:, None]).long()
        with torch.no_grad():
            torch.testing.assert_close(cols["values"] * attn, shifted_values(ref.model, cols["input_ids"], attn) * attn)
        s.data_plane.clear_samples(None, TRAIN_PARTITION)

        policy_before, value_before = weights(s.workers.policy), weights(s.workers.value)
        rows = [ppo_step(s, loss, step) for step in range(2)]
        policy_after, value_after = weights(s.workers.policy), weights(s.workers.value)
        assert [k for k in policy_before if torch.equal(policy_before[k], policy_after[k])] == []
        assert [k for k in value_before if torch.equal(value_before[k], value_after[k])] == []
        for r in rows:
            for key in ("train/loss", "train/value_loss", "train/vf_clipfrac", "train/values_mean",
                        "train/returns_mean", "critic/explained_var", "train/clip_fraction", "train/grad_norm"):
                assert key in r and math.isfinite(r[key]), key
        assert s.data_plane.list_samples(TRAIN_PARTITION) == []
    finally:
        s.close()


def test_ppo_train_logs_metrics_and_checkpoints_both_models(tmp_path):
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    summary = train(small_cfg(tmp_path), quiet=True)
    rows = [r for r in read_metrics(tmp_path / "logs") if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert "validation/accuracy" in rows[1] and summary["accuracy_after"] is not None
    assert all(math.isfinite(r["critic/explained_var"]) for r in rows)
    step = tmp_path / "checkpoints" / "step_3"
    assert AutoModelForCausalLM.from_pretrained(step / "policy" / "weights").num_parameters() > 0
    critic = AutoModelForTokenClassification.from_pretrained(step / "value" / "weights")
    assert critic.config.num_labels == 1 and (step / "value" / "optimizer.pt").is_file()


def test_split_run_equals_straight_run(tmp_path):
    """Resume restores policy, value, both optimizers, the dataloader and the RNGs."""
    train(small_cfg(tmp_path / "straight", "ppo.max_num_steps=4"), quiet=True)
    train(small_cfg(tmp_path / "split", "ppo.max_num_steps=2"), quiet=True)
    train(small_cfg(tmp_path / "split", "ppo.max_num_steps=4", "checkpointing.resume=true"), quiet=True)
    rows_a = [r for r in _timings_free(read_metrics(tmp_path / "straight" / "logs")) if r["step"] > 0]
    rows_b = [r for r in _timings_free(read_metrics(tmp_path / "split" / "logs")) if r["step"] > 0]
    assert len(rows_a) == 4 and rows_a == rows_b


def test_critic_warmup_kl_in_reward_and_dapo_filters(tmp_path, first_digit_env):
    """policy_training_start_step holds the actor; KL-in-reward, dynamic sampling, overlong filtering, VAPO λ."""
    s = Session(small_cfg(
        tmp_path, "warmup.enabled=false", "checkpointing.enabled=false", "ppo.policy_training_start_step=1",
        "loss_fn.reference_policy_kl_penalty=0.05", "loss_fn.use_kl_in_reward=true",
        "ppo.use_dynamic_sampling=true", "ppo.batch_multiplier=2", "ppo.overlong_filtering=true",
        "ppo.adv_estimator.length_adaptive_alpha=0.5", "ppo.adv_estimator.gae_lambda_value=1.0",
    ), quiet=True)
    try:
        s.start()
        loss = ClippedPGLoss(s.cfg.loss_fn.options(), reference=s.plan.needs_reference)
        policy0, value0 = weights(s.workers.policy), weights(s.workers.value)
        r0 = ppo_step(s, loss, 0)
        policy1, value1 = weights(s.workers.policy), weights(s.workers.value)
        assert all(torch.equal(policy0[k], policy1[k]) for k in policy0)  # critic warm-up: actor untouched
        assert not all(torch.equal(value0[k], value1[k]) for k in value0)
        assert r0["train/policy_trained"] == 0 and "train/loss" not in r0
        r1 = ppo_step(s, loss, 1)
        assert r1["train/policy_trained"] == 1 and r1["train/kl_penalty"] == 0  # KL went into the reward
        assert r1["train/dynamic_sampling_num_gen_batches"] >= 1 and r1["train/global_valid_seqs"] <= 16
        policy2 = weights(s.workers.policy)
        assert not all(torch.equal(policy1[k], policy2[k]) for k in policy1)
    finally:
        s.close()


def test_raw_reward_estimator_runs_without_a_critic(tmp_path, first_digit_env):
    s = Session(small_cfg(tmp_path, "warmup.enabled=false", "checkpointing.enabled=false",
                          "ppo.adv_estimator.name=raw_reward"), quiet=True)
    try:
        s.start()
        loss = ClippedPGLoss(s.cfg.loss_fn.options(), reference=s.plan.needs_reference)
        assert s.workers.value is None
        r = ppo_step(s, loss, 0)
        assert math.isfinite(r["train/loss"]) and "critic/explained_var" not in r
    finally:
        s.close()
