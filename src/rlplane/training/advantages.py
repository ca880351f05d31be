"""The advantages of the GRPO family under ``grpo.adv_estimator.name``; the math is in :mod:`rlplane.algorithms`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rlplane.algorithms.advantages import (
    clip_advantages,
    gdpo_advantages,
    grpo_advantages,
    reinforce_plus_plus_advantages,
)
from rlplane.dataplane import KVBatchMeta
from rlplane.dataplane.columns import PREV_LOGPROBS, REFERENCE_LOGPROBS, TOKEN_MASK
from rlplane.training.loop import TrainingStopped
from rlplane.training.rollouts import REWARD_COMPONENT_PREFIX, TRAIN_PARTITION

if TYPE_CHECKING:
    from rlplane.training.session import Session


def estimator_advantages(
    s: Session, meta: KVBatchMeta, carry: dict[str, torch.Tensor], sample_mask: torch.Tensor
) -> tuple[list[torch.Tensor], dict[str, float]]:
    """The step's advantages, one row per sample (its sequence length), then ``advantage_clip_low/high``.

    ``grpo`` and ``gdpo`` (over the carry's ``reward/<name>``) give one value per sample;
    ``reinforce_plus_plus`` whitens over the trained tokens read from the data plane (KL in the reward if
    ``loss_fn.use_kl_in_reward``). Also returns ``advantages/mean|max|min``.
    """
    g, lf = s.cfg.grpo, s.cfg.loss_fn
    est, lengths = g.adv_estimator, meta.seq_lens
    if est.name == "reinforce_plus_plus":
        kl_in_reward = lf.options().kl_in_reward
        fields = [TOKEN_MASK] + [PREV_LOGPROBS, REFERENCE_LOGPROBS] * (kl_in_reward is not None)
        cols = s.data_plane.get_samples(meta, TRAIN_PARTITION, fields)
        mask = cols[TOKEN_MASK].float() * sample_mask[:, None]  # (B, T): the tokens trained on
        adv = reinforce_plus_plus_advantages(carry["group"], carry["rewards"], mask, minus_baseline=est.minus_baseline,
                                             kl_in_reward=kl_in_reward, prev_logprobs=cols.get(PREV_LOGPROBS),
                                             reference_logprobs=cols.get(REFERENCE_LOGPROBS))  # (B, T)
        adv = clip_advantages(adv, g.advantage_clip_low, g.advantage_clip_high)
        on = mask != 0
        stats = adv[on] if on.any() else adv.new_zeros(1)
        rows = [adv[i, : lengths[i]] for i in range(len(lengths))]
    else:
        if est.name == "gdpo":
            components = {k[len(REWARD_COMPONENT_PREFIX):]: v for k, v in carry.items()
                          if k.startswith(REWARD_COMPONENT_PREFIX)}
            if len(components) < 2:
                raise TrainingStopped(
                    f"grpo.adv_estimator.name = gdpo: the environment gave {len(components)} reward components "
                    f"{sorted(components)}, GDPO needs at least 2 (e.g. task arithmetic: correct, format); "
                    "use an environment with reward components or set grpo.adv_estimator.name=grpo"
                )
            adv = gdpo_advantages(carry["group"], components, reward_weights=est.reward_weights,
                                  normalize_rewards=est.normalize_rewards,
                                  use_leave_one_out_baseline=est.use_leave_one_out_baseline)  # (B,)
        else:
            adv = grpo_advantages(carry["group"], carry["rewards"], normalize_rewards=est.normalize_rewards,
                                  use_leave_one_out_baseline=est.use_leave_one_out_baseline,
                                  minus_baseline=est.minus_baseline)  # (B,)
        adv = stats = clip_advantages(adv, g.advantage_clip_low, g.advantage_clip_high)
        # One value per sample repeated over its length: per-sample views of one tensor.
        rows = list(adv.repeat_interleave(torch.tensor(lengths, dtype=torch.long)).split(list(lengths)))
    return rows, {"advantages/mean": float(stats.mean()), "advantages/max": float(stats.max()),
                  "advantages/min": float(stats.min())}
