"""The advantages of the GRPO family (sync and async GRPO): ``grpo.adv_estimator.name`` picks
group baselines (``grpo``), per-component group baselines (``gdpo``) or REINFORCE++'s token-level
whitening (``reinforce_plus_plus``), then ``advantage_clip_low/high``. A tested building block the
GRPO steps call; the math is in :mod:`rlplane.algorithms.advantages`.
"""

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
    """The step's advantages under ``grpo.adv_estimator.name``, one row per sample (its sequence
    length; only the ``token_mask`` positions are trained on), then ``advantage_clip_low/high``.

    - ``grpo``: :func:`~rlplane.algorithms.grpo_advantages`, one value per sample.
    - ``gdpo``: :func:`~rlplane.algorithms.gdpo_advantages` over the carry's ``reward/<name>``
      components (the environment's per-sample reward parts), one value per sample.
    - ``reinforce_plus_plus``: :func:`~rlplane.algorithms.reinforce_plus_plus_advantages` over the
      trained tokens (``token_mask · sample_mask``, read from the data plane: the whitening is a
      statistic of the whole batch), with ``β·KL(prev ‖ ref)`` in the reward if ``loss_fn.use_kl_in_reward``.

    Returns the rows and ``advantages/mean|max|min`` (over samples; over trained tokens for REINFORCE++).
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
        # One value per sample repeated over its length: one tensor split into per-sample views.
        rows = list(adv.repeat_interleave(torch.tensor(lengths, dtype=torch.long)).split(list(lengths)))
    return rows, {"advantages/mean": float(stats.mean()), "advantages/max": float(stats.max()),
                  "advantages/min": float(stats.min())}
