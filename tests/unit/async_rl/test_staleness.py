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


def test_token_ages_per_version_when_a_response_spans_a_refit():
    # In-flight weight updates: sample 0 began at version 3 (oldest token) and got the weights of
    # version 4 after 2 tokens; sample 1 is all version 4; sample 2 is masked out (loss_multiplier 0).
    g = TrajectoryGroup(prompt_idx=0, generation_version=3, target_version=5,
                        meta=KVBatchMeta("train", None, ["a", "b", "c"]),
                        carry={"generated_tokens": torch.tensor([6, 4, 5]),
                               "loss_multiplier": torch.tensor([1.0, 1.0, 0.0]),
                               "oldest_version": torch.tensor([3, 4, 3]),
                               # (per sample: tokens at oldest + 0, + 1, + 2)  [2, 4, 0], [4, 0, 0], [5, 0, 0]
                               "version_tokens/0": torch.tensor([2, 4, 5]),
                               "version_tokens/1": torch.tensor([4, 0, 0]),
                               "version_tokens/2": torch.tensor([0, 0, 0])})
    ages, tokens = group_token_ages([g], current_version=5)
    # Per (sample, k): age 5 - oldest - k: sample 0 -> 2, 1, 0; sample 1 -> 1, 0, 0 (clamped from -1);
    # tokens version_tokens × loss_multiplier.
    assert ages.tolist() == [2, 1, 0, 1, 0, 0, 2, 1, 0]
    assert tokens.tolist() == [2.0, 4.0, 0.0, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    m = token_age_metrics(ages, tokens, max_age_steps=2)
    # 10 tokens: age 2: 2, age 1: 4 + 4 = 8. mean = (2·2 + 1·8) / 10 = 1.2; p50 = 1; max = 2.
    assert abs(m["token_age/mean"] - 1.2) < 1e-12 and m["token_age/p50"] == 1.0 and m["token_age/max"] == 2.0
    assert [round(m[f"tokens_from_version_minus_{k}"], 12) for k in range(3)] == [0.0, 0.8, 0.2]


def test_respan_version_carry_folds_when_lowered_and_pads_when_raised():
    from rlplane.async_rl.staleness import respan_version_carry, version_carry, version_token_counts

    # Two samples: versions 3,4,5,5 (oldest 3) and 7 (oldest 7); span 2: counts [1,1,2] and [1,0,0].
    versions = [torch.tensor([3, 4, 5, 5, -1]), torch.tensor([7, -1])]
    mask = [torch.tensor([1, 1, 1, 1, 0]), torch.tensor([1, 0])]
    carry = {"rewards": torch.tensor([1.0, 0.0]), **version_carry(versions, mask, 0, span=2)}
    assert version_token_counts(carry).tolist() == [[1, 1, 2], [1, 0, 0]]
    lowered = respan_version_carry(carry, 1)  # k >= 1 add up in k = 1: as version_carry with span 1
    assert version_token_counts(lowered).tolist() == [[1, 3], [1, 0]]
    assert set(lowered) == {"rewards", "oldest_version", "version_tokens/0", "version_tokens/1"}
    assert version_token_counts(lowered).tolist() == version_token_counts(version_carry(versions, mask, 0, 1)).tolist()
    raised = respan_version_carry(carry, 4)  # new columns zero
    assert version_token_counts(raised).tolist() == [[1, 1, 2, 0, 0], [1, 0, 0, 0, 0]]
    assert torch.equal(raised["oldest_version"], carry["oldest_version"])
    assert respan_version_carry({"rewards": torch.ones(2)}, 3).keys() == {"rewards"}  # no columns: as is
