"""Token age metrics of an async step, by hand."""

from __future__ import annotations

import torch

from rlplane.async_rl import TrajectoryGroup
from rlplane.async_rl.staleness import group_token_ages, token_age_metrics
from rlplane.dataplane import KVBatchMeta


def test_token_age_metrics_hand_computed():
    ages = torch.tensor([0, 1, 1, 2])
    tokens = torch.tensor([10.0, 5.0, 5.0, 30.0])  # 50 tokens
    m = token_age_metrics(ages, tokens, max_age_steps=3)
    # mean = (0·10 + 1·10 + 2·30) / 50 = 70 / 50 = 1.4
    assert abs(m["token_age/mean"] - 1.4) < 1e-12 and m["token_age/max"] == 2.0
    # shares: age 0: 10/50, age 1: 10/50, age 2: 30/50, age 3: none; cumulative 0.2, 0.4, 1.0 -> p50 = 2
    assert m["token_age/p50"] == 2.0
    shares = [m[f"tokens_from_version_minus_{k}"] for k in range(4)]
    assert [round(x, 12) for x in shares] == [0.2, 0.2, 0.6, 0.0]
    # Exactly half at age 0 (10 of 20): the median is 0. A sample with no trained tokens has no age.
    m = token_age_metrics(torch.tensor([0, 1, 3]), torch.tensor([10.0, 10.0, 0.0]), max_age_steps=3)
    assert m["token_age/p50"] == 0.0 and m["token_age/max"] == 1.0 and m["tokens_from_version_minus_3"] == 0.0
    assert token_age_metrics(torch.tensor([1]), torch.tensor([0.0]), 1)["token_age/mean"] == 0.0


def test_group_token_ages_weights_by_trained_tokens():
    def group(version, generated, mult):
        return TrajectoryGroup(prompt_idx=0, generation_version=version, target_version=5,
                               meta=KVBatchMeta("train", None, [f"v{version}_g{i}" for i in range(len(mult))]),
                               carry={"generated_tokens": torch.tensor(generated),
                                      "loss_multiplier": torch.tensor(mult)})

    # generated_tokens = the token mask's sum per sample (masks [0,1,1], [0,1,0] | [0,0,1], [1,1,1])
    groups = [group(4, [2, 1], [1.0, 1.0]), group(3, [1, 3], [1.0, 0.0])]
    ages, tokens = group_token_ages(groups, current_version=5)
    assert ages.tolist() == [1, 1, 2, 2] and tokens.tolist() == [2.0, 1.0, 1.0, 0.0]  # masked-out sample: 0 tokens
