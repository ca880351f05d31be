"""The driver never reads a per-token column in a step, except where the config asks for it.

The data-plane client the driver holds is wrapped after the workers are built (they keep the real
one), so every ``get_samples`` the step makes on the driver is recorded with the fields it asked for,
and every ``put_samples`` with the fields it wrote: a driver that writes the rollout's columns held
them first (async GRPO before its collector wrote into the shared plane).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlplane.config.loading import load_config
from rlplane.dataplane.columns import (
    ADVANTAGES,
    COLUMNS,
    GENERATION_LOGPROBS,
    PREV_LOGPROBS,
    REFERENCE_LOGPROBS,
    RETURNS,
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
        self.inner, self.reads, self.writes = inner, [], []

    def get_samples(self, sample_ids, partition_id, select_fields, *args, **kwargs):
        self.reads.append(list(select_fields))
        return self.inner.get_samples(sample_ids, partition_id, select_fields, *args, **kwargs)

    def put_samples(self, sample_ids, partition_id, fields, *args, **kwargs):
        self.writes.append(list(fields))
        return self.inner.put_samples(sample_ids, partition_id, fields, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def per_token(calls: list[list[str]]) -> set[str]:
    return {f for fields in calls for f in fields if f in COLUMNS and COLUMNS[f].per_token}


def per_token_reads(client: RecordingClient) -> set[str]:
    return per_token(client.reads)


def run_steps(tmp_path, preset, section, step_fn, extra=(), loss=None):
    cfg = load_config(preset, [*(f"{section}.{x}" for x in SMALL), *COMMON, f"run_dir={tmp_path}", *extra])
    with Session(cfg, quiet=True) as s:  # the critic and the teacher: the plan's roles for the preset
        s.start()
        loss = loss or ClippedPGLoss(cfg.loss_fn.options(), reference=s.plan.needs_reference)
        s.data_plane = client = RecordingClient(s.data_plane)
        for step in range(2):
            step_fn(s, loss, step)
    # The driver writes only what it computes: advantages (and PPO's GAE returns), never the rollout's columns.
    assert per_token(client.writes) <= {ADVANTAGES, RETURNS}
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
    from rlplane.recipes.distillation import distillation_loss, distillation_step

    extra = ["teacher.warmup.enabled=false", "teacher.tiny.hidden_size=64"]
    cfg = load_config("distill_arithmetic", [f"run_dir={tmp_path}", *extra])
    client = run_steps(tmp_path, "distill_arithmetic", "distillation", distillation_step, extra,
                       loss=distillation_loss(cfg))
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

    client = run_steps(tmp_path, "ppo_arithmetic", "ppo", ppo_step, ["ppo.ppo_epochs=1", *extra])
    assert per_token_reads(client) == allowed


def tensors_in(obj):
    """Every tensor inside ``obj`` (dataclasses, dicts, lists, tuples)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from tensors_in(getattr(obj, f.name))
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensors_in(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from tensors_in(v)


_PROCESS = "grpo.async_grpo.collector_process=true"


@pytest.mark.parametrize("extra", [[_PROCESS], [_PROCESS, "loss_fn.reference_policy_kl_penalty=0.05"], []],
                         ids=["process", "process-kl", "thread"])
def test_async_grpo_driver_reads_and_receives_no_per_token_column(tmp_path, first_digit_env, extra):
    """The collector writes its groups into the shared plane (from its own process by default, through
    the forwarding client and the server thread here); the driver gets receipts and (G,) carries."""
    from rlplane.recipes.async_grpo import Collector, async_grpo_step
    from rlplane.runtime.process_actor import ProcessActor

    G = 4
    cfg = load_config(None, [*(f"grpo.{x}" for x in SMALL), *COMMON, f"run_dir={tmp_path}",
                             "grpo.async_grpo.enabled=true", "loss_fn.use_importance_sampling_correction=true",
                             *extra])
    received = []
    collector = Collector(cfg.grpo)
    with Session(cfg, quiet=True, side=collector) as s:
        s.start()  # starts the collector, with the real client
        loss = ClippedPGLoss(cfg.loss_fn.options(), reference=s.plan.needs_reference)
        assert isinstance(collector.actor, ProcessActor) == (_PROCESS in extra)
        real_call = collector.actor.call

        def recording_call(method, *args, **kwargs):
            out = real_call(method, *args, **kwargs)
            received.extend(tensors_in(out))
            return out

        collector.actor.call = recording_call
        s.data_plane = client = RecordingClient(s.data_plane)
        for step in range(2):
            async_grpo_step(s, collector, loss, step)
    assert per_token_reads(client) == set()
    assert per_token(client.writes) <= {ADVANTAGES}
    # Whatever crosses from the collector to the driver is per sample: G values per group, not tokens.
    assert received and all(t.numel() == G for t in received), sorted({tuple(t.shape) for t in received})


def test_validation_goes_through_the_val_partition(tmp_path, first_digit_env):
    """NeMo RL's validate_sync: the rollout worker writes under ``val`` keys, the driver reads the rewards
    of the carry and the greedy samples' tokens for their text (NeMo RL reads their message logs from the
    plane), writes nothing per token, and the partition is cleared after."""
    from rlplane.training.loop import VAL_PARTITION

    cfg = load_config(None, [*(f"grpo.{x}" for x in SMALL), *COMMON, f"run_dir={tmp_path}",
                             "grpo.val_num_generations_per_prompt=2"])
    with Session(cfg, quiet=True) as s:
        s.start()
        plane = s.data_plane
        s.data_plane = client = RecordingClient(plane)
        metrics = s.validate()
        assert 0.0 <= metrics["validation/accuracy"] <= 1.0 and "validation/pass@2" in metrics
        assert per_token_reads(client) == {"input_ids", "token_mask"} and per_token(client.writes) == set()
        # 8 greedy samples and 8 prompts × 2 sampled ones were written there, and are gone.
        assert plane.list_samples(VAL_PARTITION) == []
        assert len(plane.index.partition(VAL_PARTITION).cleared) == 8 + 16
