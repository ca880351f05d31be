"""Synchronous PPO with a value model and GAE through the data plane (NeMo RL ``ppo_train``).

Each step: refit → rollouts (as GRPO) → critic ``values`` → sample mask, logprobs → GAE (or raw reward) on
the driver (whitening needs the whole batch) → ``ppo_epochs`` × (critic, then actor after
``policy_training_start_step``) → clear keys. Advantages, returns and old values are not refreshed
between epochs (as NeMo RL and veRL).
"""

from __future__ import annotations

import torch

from rlplane.algorithms.advantages import raw_reward_advantages
from rlplane.algorithms.gae import compute_gae
from rlplane.algorithms.value_loss import explained_variance
from rlplane.config.schema import RunConfig
from rlplane.dataplane.columns import (
    ADVANTAGES,
    GENERATION_LOGPROBS,
    INPUT_IDS,
    PREV_LOGPROBS,
    REFERENCE_LOGPROBS,
    RETURNS,
    TOKEN_MASK,
    VALUES,
)
from rlplane.runtime.interrupts import StopSignals
from rlplane.training import Components, DataExhausted, Session, Timer
from rlplane.training.rollouts import (
    TRAIN_PARTITION,
    add_train_metrics,
    collect_rollouts,
    policy_logprobs,
    rollout_metrics,
    stamp_sample_mask,
)
from rlplane.utils.metrics import merge_rank_metrics
from rlplane.workers.policy import ClippedPGLoss
from rlplane.workers.value import ValueWorker

__all__ = ["TRAIN_COLUMNS", "critic_metrics", "mean_over_epochs", "ppo_advantages", "ppo_step", "train"]

# The step's columns: from rollout, policy workers (logprobs), value workers (values), the driver (GAE).
TRAIN_COLUMNS = [INPUT_IDS, TOKEN_MASK, GENERATION_LOGPROBS, PREV_LOGPROBS, REFERENCE_LOGPROBS, ADVANTAGES, VALUES,
                 RETURNS]


def ppo_advantages(
    estimator: str,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    values: torch.Tensor | None,
    gae_kwargs: dict,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(A, R)`` (B, T) of a PPO step, meaningless off ``mask = token_mask · sample_mask``.

    ``gae``: :func:`~rlplane.algorithms.compute_gae` with ``gae_kwargs``; ``raw_reward``: ``A_t = r``, ``R = None``.
    """
    if estimator == "raw_reward":
        return raw_reward_advantages(rewards, mask, normalize_advantages=gae_kwargs["normalize_advantages"]), None
    return compute_gae(rewards, values, mask, **gae_kwargs)


def mean_over_epochs(per_epoch: list[dict[str, float]]) -> dict[str, float]:
    """Combine several passes' metrics: extrema by min/max, everything else by the mean."""
    out: dict[str, float] = {}
    for key in per_epoch[0] if per_epoch else ():
        vals = [m[key] for m in per_epoch if key in m]
        out[key] = min(vals) if key.endswith("_min") else max(vals) if key.endswith("_max") else sum(vals) / len(vals)
    return out


def critic_metrics(per_epoch: list[dict[str, float]]) -> dict[str, float]:
    """The critic's logged metrics from its per-pass :func:`~rlplane.algorithms.value_loss` metrics.

    Losses, clip fraction, grad norm, lr: mean over passes. Values, returns (``returns_std = sqrt(E[R²] − μ_R²)``)
    and ``critic/explained_var`` come from the first pass, whose values GAE used.
    """
    if not per_epoch:
        return {}
    mean = mean_over_epochs(per_epoch)
    first = per_epoch[0]
    out = {
        "value_loss": mean["loss"],
        "vf_clipfrac": mean["vf_clipfrac"],
        "value_grad_norm": mean["grad_norm"],
        "value_lr": mean["lr"],
        "values_mean": first["values_mean"],
        "values_min": first["values_min"],
        "values_max": first["values_max"],
        "returns_mean": first["returns_mean"],
        "returns_std": max(first["returns_sq_mean"] - first["returns_mean"] ** 2, 0.0) ** 0.5,
        "critic/explained_var": float(
            explained_variance(first["returns_mean"], first["values_mean"], first["returns_sq_mean"],
                               first["residual_sq_mean"])
        ),
    }
    return out


def ppo_step(s: Session, loss: ClippedPGLoss, step: int) -> dict[str, float]:
    """One PPO step (``step`` counts from 0); returns its metrics (train/*, critic/*, timing/train/*)."""
    cfg, g = s.cfg, s.cfg.ppo
    timer = Timer()
    metrics: dict[str, float] = {}
    gbs = cfg.policy.train_global_batch_size
    critic = s.workers.value

    with timer("refit"):
        s.refit.if_stale()
    s.data_plane.register_partition(TRAIN_PARTITION, TRAIN_COLUMNS, s.plan.sizes.samples_per_step)

    # ---- rollout, rewards, dynamic sampling → values → sample mask, logprobs ----------------------
    meta, carry = collect_rollouts(s, timer, metrics)
    s.refit.release()  # colocated: the generators sleep while the policy trains
    if critic is not None:
        with timer("values"):
            critic.run_sharded(ValueWorker.compute_values, meta)
    meta, sample_mask = stamp_sample_mask(g.overlong_filtering, meta, carry)
    meta, sample_mask = policy_logprobs(s, meta, carry, sample_mask, loss, timer, metrics)

    # ---- advantages and returns (token level): GAE runs on the driver (whitening is a batch statistic)
    with timer("advantages"):
        est = g.adv_estimator
        kl_in_reward = getattr(loss, "options", s.cfg.loss_fn.options()).kl_in_reward
        fields = [TOKEN_MASK] + [VALUES] * (critic is not None)
        fields += [PREV_LOGPROBS, REFERENCE_LOGPROBS] * (kl_in_reward is not None)
        cols = s.data_plane.get_samples(meta, TRAIN_PARTITION, fields)  # (B, T) each
        mask = cols[TOKEN_MASK].float() * sample_mask[:, None]  # (B, T): trained response tokens
        gae_kwargs = est.gae_kwargs()
        if kl_in_reward is not None:  # r_t −= β·KL_t(prev ‖ ref); the loss's own KL term is then off (clipped_pg_loss)
            gae_kwargs.update(kl_in_reward=kl_in_reward, prev_logprobs=cols[PREV_LOGPROBS],
                              reference_logprobs=cols[REFERENCE_LOGPROBS])
        adv, ret = ppo_advantages(est.name, carry["rewards"], mask, cols.get(VALUES), gae_kwargs)  # (B, T) each
        lengths = meta.seq_lens
        written = {ADVANTAGES: [adv[i, : lengths[i]] for i in range(len(lengths))]}
        if ret is not None:
            written[RETURNS] = [ret[i, : lengths[i]].float() for i in range(len(lengths))]
        s.data_plane.put_samples(list(meta.sample_ids), TRAIN_PARTITION, written)
        on = mask != 0
        if on.any():
            metrics.update({"advantages/mean": float(adv[on].mean()), "advantages/max": float(adv[on].max()),
                            "advantages/min": float(adv[on].min())})

    # ---- ppo_epochs × (critic, then actor); the step is over ---------------------------------------
    train_actor = step >= g.policy_training_start_step
    critic_passes, actor_passes = [], []
    for _ in range(g.ppo_epochs):
        if critic is not None:
            with timer("value_training"):
                critic_passes.append(merge_rank_metrics(critic.run_sharded(ValueWorker.train, meta, batch_size=gbs)))
        if train_actor:
            with timer("policy_training"):
                actor_passes.append(merge_rank_metrics(s.policy.train_from_meta(meta, loss)))
    if train_actor:
        s.refit.mark_stale()
    s.data_plane.clear_samples(None, TRAIN_PARTITION, wait=False)  # nobody needs the answer: do not wait

    add_train_metrics(metrics, mean_over_epochs(actor_passes))
    cm = critic_metrics(critic_passes)
    explained = cm.pop("critic/explained_var", None)
    metrics.update(cm)
    metrics["policy_trained"] = float(train_actor)
    metrics.update(rollout_metrics(carry, meta.seq_lens))
    out = {f"train/{k}": v for k, v in metrics.items()}
    if explained is not None:
        out["critic/explained_var"] = explained
    return {**out, **timer.metrics()}


def train(cfg: RunConfig, *, quiet: bool = False, components: Components | None = None,
          signals: StopSignals | None = None) -> dict:
    """Run the whole job: warm-up (or resume), PPO steps, validation, checkpoints. Returns a summary."""
    if cfg.algorithm != "ppo":
        raise ValueError(f"recipes.ppo.train needs algorithm: ppo, got {cfg.algorithm!r}")
    with Session(cfg, quiet, components=components, signals=signals) as s:  # the critic: the plan's value role (GAE)
        loss = s.components.loss_fn or ClippedPGLoss(cfg.loss_fn.options(), reference=s.plan.needs_reference,
                                                     prev_from_forward=s.plan.skips_prev_logprob_forward)
        for step in range(s.start(), s.last_step()):
            s.begin_step(step)
            try:
                metrics = ppo_step(s, loss, step)
            except DataExhausted as e:  # max_num_epochs used up inside a step (dynamic sampling)
                s.stop_early(step, e)
                break
            done = s.trained(step)
            s.validate_if_due(done, metrics)
            s.log_step(done, metrics)
            saved = s.checkpoint_if_due(done, metrics)
            if s.should_stop(done, metrics, saved):
                break
        return s.summary()
