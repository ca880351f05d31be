"""The driver never reads a per-token column in a step, except where the config asks for it.

The data-plane client the driver holds is wrapped after the workers are built (they keep the real
one), so every ``get_samples`` the step makes on the driver is recorded with the fields it asked for.
"""

from __future__ import annotations

import pytest

from rlplane.config.loading import load_config
from rlplane.dataplane.columns import (
    COLUMNS,
    GENERATION_LOGPROBS,
    PREV_LOGPROBS,
    REFERENCE_LOGPROBS,
    TOKEN_MASK,
    VALUES,
)
from rlplane.training import Session
from rlplane.workers.policy import ClippedPGLoss

SMALL = [
    "num_prompts_per_step=4", "num_generations_per_prompt=4", "max_num_steps=2", "max_val_samples=8",
    "val_batch_size=8", "val_at_start=false",
]
COMMON = ["warmup.enabled=false", "checkpointing.enabled=false", "logger.progress_bar=false",
          "logger.tensorboard_enabled=false", "policy.train_global_batch_size=16", "policy.train_micro_batch_size=8"]


class RecordingClient:
    """Passes every call through to ``inner``; records the fields of each ``get_samples``."""

    def __init__(self, inner):
        self.inner, self.reads = inner, []

    def get_samples(self, sample_ids, partition_id, select_fields, *args, **kwargs):
        self.reads.append(list(select_fields))
        return self.inner.get_samples(sample_ids, partition_id, select_fields, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def per_token_reads(client: RecordingClient) -> set[str]:
    return {f for fields in client.reads for f in fields if f in COLUMNS and COLUMNS[f].per_token}


def run_steps(tmp_path, preset, section, step_fn, extra=(), critic=False, teacher_cfg=None, loss=None):
    cfg = load_config(preset, [*(f"{section}.{x}" for x in SMALL), *COMMON, f"run_dir={tmp_path}", *extra])
    with Session(cfg, quiet=True, critic=critic, teacher_cfg=teacher_cfg(cfg) if teacher_cfg else None) as s:
        s.start()
        loss = loss or ClippedPGLoss(cfg.loss_fn.options(), reference=s.workers.needs_reference)
        s.data_plane = client = RecordingClient(s.data_plane)
        for step in range(2):
            step_fn(s, loss, step)
    return client


@pytest.mark.parametrize("extra, allowed", [
    ([], set()),
    (["loss_fn.reference_policy_kl_penalty=0.05", "grpo.use_dynamic_sampling=true", "grpo.batch_multiplier=2",
      "grpo.overlong_filtering=true"], set()),
    # asked for by the config: masking needs whole sequences' logprob errors
    (["grpo.seq_logprob_error_threshold=2.0"], {GENERATION_LOGPROBS, PREV_LOGPROBS, TOKEN_MASK}),
])
def test_sync_grpo_driver_reads_no_per_token_column(tmp_path, first_digit_env, extra, allowed):
    from rlplane.recipes.grpo import grpo_step

    client = run_steps(tmp_path, None, "grpo", grpo_step, extra)
    assert per_token_reads(client) == allowed


def test_distillation_driver_reads_no_per_token_column(tmp_path, first_digit_env):
    from rlplane.recipes.distillation import ReverseKLLoss, distillation_step, teacher_config

    client = run_steps(tmp_path, "distill_arithmetic", "distillation", distillation_step,
                       ["teacher.warmup.enabled=false", "teacher.tiny.hidden_size=64"],
                       teacher_cfg=teacher_config, loss=ReverseKLLoss())
    assert per_token_reads(client) == set()


@pytest.mark.parametrize("extra, allowed", [
    # raw_reward: A = r on every token, built from the token mask on the driver
    (["ppo.adv_estimator.name=raw_reward"], {TOKEN_MASK}),
    # GAE runs on the driver (advantage whitening is a whole-batch statistic): the token mask and the
    # critic's values, and with KL-in-reward the prev/reference logprobs. Moving GAE into the value
    # workers (per-rank moments all-reduced as scalars) would empty this set; not done yet.
    ([], {TOKEN_MASK, VALUES}),
    (["loss_fn.reference_policy_kl_penalty=0.05", "loss_fn.use_kl_in_reward=true"],
     {TOKEN_MASK, VALUES, PREV_LOGPROBS, REFERENCE_LOGPROBS}),
])
def test_ppo_driver_reads_only_what_gae_needs(tmp_path, first_digit_env, extra, allowed):
    from rlplane.recipes.ppo import ppo_step

    critic = "ppo.adv_estimator.name=raw_reward" not in extra
    client = run_steps(tmp_path, "ppo_arithmetic", "ppo", ppo_step, ["ppo.ppo_epochs=1", *extra], critic=critic)
    assert per_token_reads(client) == allowed
