"""Reward components through the rollout: summed over turns, 0 for a sample whose environment failed,
carried to the driver as ``reward/<name>`` (what GDPO reads)."""

from __future__ import annotations

import pytest
import torch

from rlplane.config.loading import load_config
from rlplane.data.datum import make_prompt_datum
from rlplane.dataplane import make_data_plane
from rlplane.envs import ENV_REGISTRY, EnvironmentReturn, register_env
from rlplane.models.configured import load_configured_policy
from tests.tiny import rollout_worker


class TwoPartEnv:
    """Per turn: component ``a`` = 1, ``b`` = 0.5, reward = a + b; terminates on the second turn."""

    reward_component_names = ("a", "b")

    def step(self, message_logs, metadata):
        turns = [m.get("turn", 0) + 1 for m in metadata]
        n = len(message_logs)
        return EnvironmentReturn([{"role": "environment", "content": "+"}] * n,
                                 [{**m, "turn": t} for m, t in zip(metadata, turns)], [None] * n,
                                 torch.full((n,), 1.5), torch.tensor([t >= 2 for t in turns]), None,
                                 reward_components={"a": torch.ones(n), "b": torch.full((n,), 0.5)})


class BrokenTwoPartEnv(TwoPartEnv):
    def step(self, message_logs, metadata):
        if any(log[0]["content"] == "5+6=" for log in message_logs):
            raise RuntimeError("verifier crashed")
        return super().step(message_logs, metadata)


@pytest.fixture
def envs():
    saved = dict(ENV_REGISTRY)
    register_env("two_part", TwoPartEnv)
    register_env("broken_two_part", BrokenTwoPartEnv)
    yield
    ENV_REGISTRY.clear()
    ENV_REGISTRY.update(saved)


def test_components_sum_over_turns_and_are_zero_where_the_env_failed(envs):
    cfg = load_config(None, ["grpo.max_rollout_turns=2", "policy.max_total_sequence_length=40",
                             "policy.generation.max_new_tokens=3"])
    model, tok = load_configured_policy(cfg.policy, cfg.loop.seed)
    dp = make_data_plane("memory")
    dp.register_partition("train", ["input_ids", "token_mask", "generation_logprobs"], 16)
    worker = rollout_worker(cfg, dp, model=model, tokenizer=tok, seed=3)
    datums = [make_prompt_datum(p, "0", tok, idx=i, task_name=t)
              for i, (p, t) in enumerate([("1+2=", "two_part"), ("5+6=", "broken_two_part")])]
    _, carry, _ = worker.rollout(datums, group_size=2, partition_id="train")
    # Two turns: a = 1 + 1, b = 0.5 + 0.5; the broken env's samples fail in turn 1: 0 everywhere.
    assert carry["reward/a"].tolist() == [2.0, 2.0, 0.0, 0.0]
    assert carry["reward/b"].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert carry["rewards"].tolist() == [3.0, 3.0, 0.0, 0.0]
