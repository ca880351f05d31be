"""collect_rollouts on scripted generation batches (no model, no data plane), and how the step's
metrics take the policy training's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlplane.config.loading import load_config
from rlplane.dataplane import KVBatchMeta
from rlplane.training.loop import Timer
from rlplane.training.plan import build_plan
from rlplane.training.rollouts import SEQ_ERROR_STATS, add_train_metrics, collect_rollouts


class _Loader:
    epoch, batches_done_in_epoch = 0, 0

    def __len__(self):
        return 100


class _ScriptedRollout:
    """Each call gives the next scripted batch: two prompts × two generations with these raw rewards."""

    def __init__(self, batches):
        self.batches, self.calls = list(batches), 0

    def rollout(self, datums, group_size, partition_id):
        rewards = torch.tensor(self.batches[self.calls], dtype=torch.float32)
        self.calls += 1
        n = len(rewards)
        meta = KVBatchMeta(partition_id=partition_id, task_name=None,
                           sample_ids=tuple(f"b{self.calls}_{i}" for i in range(n)))
        carry = {"rewards": rewards, "group": torch.arange(n // group_size).repeat_interleave(group_size),
                 "response_lengths": torch.full((n,), 3), "truncated": torch.zeros(n, dtype=torch.bool),
                 "env_failed": torch.zeros(n, dtype=torch.bool)}
        return meta, carry, {}


def _session(batches, *extra):
    cfg = load_config(None, ["grpo.num_prompts_per_step=2", "grpo.num_generations_per_prompt=2",
                             "policy.train_global_batch_size=4", *extra])
    cleared = []
    prompts = SimpleNamespace(loader=_Loader(), next=lambda: ["p", "q"], note_trained=lambda groups: None)
    return SimpleNamespace(
        cfg=cfg, plan=build_plan(cfg), prompts=prompts, workers=SimpleNamespace(rollout=_ScriptedRollout(batches)),
        data_plane=SimpleNamespace(clear_samples=lambda ids, partition, **kw: cleared.append(ids)),
    )


def test_reward_counts_every_dynamic_sampling_batch():
    # Batch 1: group [1, 1] has no signal (dropped), [0, 1] kept; batch 2: [0, 0] dropped, [1, 0] kept.
    s = _session([[1, 1, 0, 1], [0, 0, 1, 0]], "grpo.use_dynamic_sampling=true")
    metrics = {}
    meta, carry = collect_rollouts(s, Timer(), metrics)
    assert s.workers.rollout.calls == 2 and metrics["dynamic_sampling_num_gen_batches"] == 2
    assert meta.sample_ids == ("b1_2", "b1_3", "b2_2", "b2_3")
    # every generated sample of the step, before the selection: 4 of 8 rewards are 1 (the first batch alone: 0.75)
    assert metrics["reward"] == pytest.approx(0.5)


def test_reward_without_dynamic_sampling_is_the_one_batch():
    s = _session([[1, 1, 0, 1]])
    metrics = {}
    collect_rollouts(s, Timer(), metrics)
    assert metrics["reward"] == pytest.approx(0.75)


def test_train_metrics_keep_the_drivers_sequence_logprob_errors():
    # With seq_logprob_error_threshold the driver's statistics (before its mask) are the logged ones.
    metrics = {"max_seq_mult_prob_error": 3.0, "reward": 0.5}
    add_train_metrics(metrics, {"max_seq_mult_prob_error": 1.5, "mean_seq_mult_prob_error": 1.2, "loss": 0.1})
    assert metrics == {"max_seq_mult_prob_error": 3.0, "reward": 0.5, "mean_seq_mult_prob_error": 1.2, "loss": 0.1}
    assert set(SEQ_ERROR_STATS) == {f"{k}_seq_mult_prob_error" for k in ("max", "mean", "min")}


def test_group_spread_metrics():
    from rlplane.training.rollouts import rollout_metrics

    # Groups by id (not contiguous): {0: [1, 0, 1, 0]} std 0.5; {1: [0.3, 0.3]} equal; {2: [2, 2]} equal.
    carry = {"rewards": torch.tensor([1.0, 0.3, 0.0, 2.0, 1.0, 0.3, 0.0, 2.0]),
             "group": torch.tensor([0, 1, 0, 2, 0, 1, 0, 2]), "truncated": torch.zeros(8, dtype=torch.bool)}
    m = rollout_metrics(carry, [5] * 8)
    assert m["reward_std_in_group"] == pytest.approx(0.5 / 3)
    assert m["equal_reward_groups"] == pytest.approx(2 / 3)
    assert m["baseline_reward/pct_mixed"] == 1.0  # means 0.5, 0.3, 2: never all-0 or all-1, yet two give no signal
