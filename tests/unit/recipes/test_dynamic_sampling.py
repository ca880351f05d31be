"""Dynamic sampling in the recipe (``collect_rollouts``) on scripted rollouts: refill across
generation batches, a first batch dropped whole, filtering on the unshaped reward, the keys of
dropped and overflow samples cleared, NeMo RL's meaning of the logged counts, data exhaustion.

The session is a stand-in with the real in-memory data plane and a rollout that returns scripted
rewards and lengths, so each case is exact and runs in milliseconds.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlplane.config.loading import load_config
from rlplane.dataplane import make_data_plane
from rlplane.training.loop import DataExhausted, Timer, TrainingStopped
from rlplane.training.plan import build_plan
from rlplane.training.rollouts import TRAIN_PARTITION, collect_rollouts

P, G = 2, 2  # prompts per step, generations per prompt: target = 4 samples


class ScriptedLoader:
    """The loader's position the recipe reads (``epoch``, ``batches_done_in_epoch``, ``len``)."""

    def __init__(self, batches_per_epoch: int):
        self.epoch, self.batches_done_in_epoch, self.n = 0, 0, batches_per_epoch

    def __len__(self):
        return self.n

    def next(self):
        if self.batches_done_in_epoch >= self.n:
            self.epoch, self.batches_done_in_epoch = self.epoch + 1, 0
        self.batches_done_in_epoch += 1


class ScriptedSession:
    """``rollout`` returns the next scripted batch: per sample (reward, response length)."""

    def __init__(self, cfg, script, batches_per_epoch=100):
        self.cfg, self.script = cfg, list(script)
        self.data_plane = make_data_plane("memory")
        self.data_plane.register_partition(TRAIN_PARTITION, ["input_ids"], P * G)
        self.train_loader = ScriptedLoader(batches_per_epoch)
        self.calls = 0
        # The session parts collect_rollouts uses: the prompt stream and the rollout worker.
        self.trained_groups: list[list[int]] = []  # what collect_rollouts reports as trained (logs/prompts.jsonl)
        self.prompts = SimpleNamespace(next=self.next_prompts, loader=self.train_loader,
                                       note_trained=self.trained_groups.append)
        self.workers = SimpleNamespace(rollout=SimpleNamespace(rollout=self.rollout))
        self.plan = build_plan(cfg)

    def next_prompts(self):
        self.train_loader.next()
        return [None] * (len(self.script[0]) // G)

    def rollout(self, datums, *, group_size, partition_id):
        batch = self.script.pop(0)
        self.calls += 1
        rewards = torch.tensor([r for r, _ in batch], dtype=torch.float32)
        lengths = torch.tensor([n for _, n in batch])
        keys = [f"b{self.calls}_{i}" for i in range(len(batch))]
        meta = self.data_plane.put_samples(keys, partition_id,
                                           {"input_ids": [torch.ones(int(n) + 1, dtype=torch.long) for n in lengths]})
        carry = {
            "rewards": rewards,
            "group": torch.arange(len(datums)).repeat_interleave(group_size),
            "truncated": torch.zeros(len(batch), dtype=torch.bool),
            "loss_multiplier": torch.ones(len(batch)),
            "prompt_lengths": torch.ones(len(batch), dtype=torch.long),
            "response_lengths": lengths,
        }
        return meta, carry, {"mean_gen_tokens_per_sample": float(lengths.float().mean())}


def cfg(*extra):
    return load_config(None, [f"grpo.num_prompts_per_step={P}", f"grpo.num_generations_per_prompt={G}",
                              "policy.train_global_batch_size=4", "grpo.use_dynamic_sampling=true", *extra])


def test_first_batch_dropped_whole_then_refilled_to_exactly_the_target():
    # Batch 1: both groups all-equal ([1,1], [0,0]) -> all 4 dropped (the old code crashed on
    # `carry["group"].max()` of an empty tensor, then on `pending.concat([meta])`).
    # Batch 2: group 0 [1,0] kept, group 1 [0,0] dropped -> 2 kept. Batch 3: [0,1] kept, [1,0] kept -> 4.
    # 2 + 4 = 6 kept >= 4: take the first 4 (batch 2's group, batch 3's first group).
    s = ScriptedSession(cfg(), [
        [(1, 3), (1, 3), (0, 3), (0, 3)],
        [(1, 3), (0, 3), (0, 3), (0, 3)],
        [(0, 3), (1, 3), (1, 3), (0, 3)],
    ])
    metrics = {}
    meta, carry = collect_rollouts(s, Timer(), metrics)
    assert list(meta.sample_ids) == ["b2_0", "b2_1", "b3_0", "b3_1"]
    assert len(meta) == len(carry["rewards"]) == P * G
    assert carry["rewards"].tolist() == [1, 0, 0, 1]
    # Groups stay distinct across batches: batch 2's group 0 is 2, batch 3's group 0 is 4.
    assert carry["group"].tolist() == [2, 2, 4, 4]
    assert metrics["dynamic_sampling_num_gen_batches"] == 3
    # NeMo RL: kept (non-zero std) samples beyond the target, cut by the final slice: 6 - 4 = 2.
    assert metrics["dynamic_sampling_num_discarded_valid_samples"] == 2
    # Raw mean over every generation batch (NeMo RL's pending_unfiltered_rewards):
    # (1+1+0+0 + 1+0+0+0 + 0+1+1+0) / 12 = 5/12.
    assert metrics["reward"] == pytest.approx(5 / 12)
    # Only the trained samples are left in the store: dropped and overflow keys are cleared.
    assert sorted(s.data_plane.list_samples(TRAIN_PARTITION)) == sorted(meta.sample_ids)


def test_filter_uses_the_unshaped_reward():
    # DAPO overlong shaping, max_response_length 4, buffer 2: expected = 2 tokens, penalty
    # min(-(L-2)/2, 0): L = 2 -> 0, L = 4 -> -1. Group 0: rewards [0, 0], lengths [2, 4] -> shaped
    # [0, -1] differ, but the task reward is all-equal: dropped (NeMo filters on the unshaped reward).
    # Group 1: [1, 0] -> kept. Batch 2 refills with [0, 1] lengths [2, 2].
    shaping = ["grpo.reward_shaping.enabled=true", "grpo.reward_shaping.overlong_buffer_length=2",
               "grpo.reward_shaping.max_response_length=4"]
    s = ScriptedSession(cfg(*shaping), [
        [(0, 2), (0, 4), (1, 2), (0, 4)],
        [(0, 2), (1, 2), (0, 2), (0, 2)],
    ])
    metrics = {}
    meta, carry = collect_rollouts(s, Timer(), metrics)
    assert list(meta.sample_ids) == ["b1_2", "b1_3", "b2_0", "b2_1"]
    # The carried rewards are the shaped ones: 1 + 0, 0 - 1, 0 + 0, 1 + 0.
    assert carry["rewards"].tolist() == [1.0, -1.0, 0.0, 1.0]
    assert metrics["dynamic_sampling_num_gen_batches"] == 2
    assert metrics["dynamic_sampling_num_discarded_valid_samples"] == 0  # 4 kept, 4 needed


def test_filter_sees_scaled_rewards_as_nemo_does():
    # Scaling [0, 2] -> [0, 1] is linear, so a group all-equal before scaling stays so after;
    # rewards above source_max are clamped: [2, 3] -> [1, 1] is all-equal and dropped.
    scaling = ["grpo.reward_scaling.enabled=true", "grpo.reward_scaling.source_max=2"]
    s = ScriptedSession(cfg(*scaling), [
        [(2, 1), (3, 1), (0, 1), (2, 1)],
        [(1, 1), (0, 1), (0, 1), (0, 1)],
    ])
    meta, carry = collect_rollouts(s, Timer(), {})
    assert list(meta.sample_ids) == ["b1_2", "b1_3", "b2_0", "b2_1"]
    assert carry["rewards"].tolist() == [0.0, 1.0, 0.5, 0.0]


def test_too_many_generation_batches_is_a_one_line_stop_and_clears_the_keys():
    s = ScriptedSession(cfg("grpo.dynamic_sampling_max_gen_batches=2"), [
        [(1, 1), (0, 1), (0, 1), (0, 1)],
        [(0, 1), (0, 1), (0, 1), (0, 1)],
    ])
    with pytest.raises(TrainingStopped) as e:
        collect_rollouts(s, Timer(), {})
    msg = str(e.value)
    assert "\n" not in msg and "grpo.dynamic_sampling_max_gen_batches = 2" in msg
    assert s.data_plane.list_samples(TRAIN_PARTITION) == []


def test_shortfall_fill_tops_up_with_all_equal_groups_and_clears_the_rest():
    # Batch 1: group 0 [1,0] kept, group 1 [0,0] dropped. Batch 2: [0,0], [1,1] both dropped. 2 kept of 4 after
    # the 2 batches allowed: fill takes the first dropped rows in generation order, batch 1's group 1.
    s = ScriptedSession(cfg("grpo.dynamic_sampling_max_gen_batches=2", "grpo.dynamic_sampling_shortfall=fill"), [
        [(1, 1), (0, 1), (0, 1), (0, 1)],
        [(0, 1), (0, 1), (1, 1), (1, 1)],
    ])
    metrics = {}
    meta, carry = collect_rollouts(s, Timer(), metrics)
    assert list(meta.sample_ids) == ["b1_0", "b1_1", "b1_2", "b1_3"]
    assert carry["rewards"].tolist() == [1, 0, 0, 0] and carry["group"].tolist() == [0, 0, 1, 1]
    assert metrics["dynamic_sampling_num_filled_samples"] == 2 and metrics["dynamic_sampling_num_gen_batches"] == 2
    # Batch 2's rows were held until the choice, then cleared: only the trained keys are left.
    assert sorted(s.data_plane.list_samples(TRAIN_PARTITION)) == sorted(meta.sample_ids)


def test_shortfall_fill_is_not_used_when_the_kept_groups_suffice():
    s = ScriptedSession(cfg("grpo.dynamic_sampling_shortfall=fill"), [
        [(1, 1), (1, 1), (0, 1), (0, 1)],
        [(1, 1), (0, 1), (0, 1), (1, 1)],
    ])
    metrics = {}
    meta, _ = collect_rollouts(s, Timer(), metrics)
    assert list(meta.sample_ids) == ["b2_0", "b2_1", "b2_2", "b2_3"]
    assert metrics["dynamic_sampling_num_filled_samples"] == 0
    assert sorted(s.data_plane.list_samples(TRAIN_PARTITION)) == sorted(meta.sample_ids)


@pytest.mark.parametrize("extra, match", [
    (["grpo.use_dynamic_sampling=false"], "only applies with dynamic sampling"),
    (["grpo.rollout_failure_policy=drop_group"], "cannot top up with failed groups"),
])
def test_shortfall_fill_needs_dynamic_sampling_and_real_rewards(extra, match):
    from rlplane.config.loading import ConfigError

    with pytest.raises(ConfigError, match=match):
        cfg("grpo.dynamic_sampling_shortfall=fill", *extra)


def test_data_exhausted_within_a_step_stops_and_clears_the_keys():
    # max_num_epochs = 1 with 2 batches per epoch: the step has 2 kept of 4 after both batches.
    s = ScriptedSession(cfg("grpo.max_num_epochs=1"), [
        [(1, 1), (0, 1), (0, 1), (0, 1)],
        [(0, 1), (0, 1), (0, 1), (0, 1)],
    ], batches_per_epoch=2)
    with pytest.raises(DataExhausted, match="grpo.max_num_epochs = 1"):
        collect_rollouts(s, Timer(), {})
    assert s.calls == 2 and s.data_plane.list_samples(TRAIN_PARTITION) == []


def test_without_dynamic_sampling_one_batch_is_taken_as_is():
    s = ScriptedSession(load_config(None, [f"grpo.num_prompts_per_step={P}", f"grpo.num_generations_per_prompt={G}",
                                           "policy.train_global_batch_size=4"]),
                        [[(1, 1), (1, 1), (0, 1), (0, 1)]])
    metrics = {}
    meta, carry = collect_rollouts(s, Timer(), metrics)
    assert len(meta) == 4 and carry["rewards"].tolist() == [1, 1, 0, 0]
    assert "dynamic_sampling_num_gen_batches" not in metrics
