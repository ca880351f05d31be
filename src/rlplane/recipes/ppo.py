"""Synchronous PPO with a value model and GAE, through the data plane (NeMo RL ``ppo_train``).

Each step: refit the generator if stale → rollouts with reward scaling/shaping and dynamic sampling
(shared with GRPO) → the critic writes ``values`` (V(s_t), right-shifted) back per sample → sample
masks, prev (and reference) logprobs → GAE (or the raw reward) over tokens; ``advantages`` and
``returns`` written back → ``ppo.ppo_epochs`` passes of: critic first, then the actor unless the
step is before ``ppo.policy_training_start_step`` (critic warm-up) → clear the step's keys. The
outer loop (validation, checkpoints of policy *and* value, resume) is the shared ``run_training``.

Advantages, returns and old values are computed once per step and not refreshed between epochs
(as NeMo RL and veRL). GAE runs on the driver: advantage whitening is a statistic of the whole
batch, so the driver reads the ``values``/``token_mask`` columns (B × T floats) for it.
"""

from __future__ import annotations

import time

import torch

from rlplane.algorithms.advantages import raw_reward_advantages
from rlplane.algorithms.gae import compute_gae
from rlplane.algorithms.losses import explained_variance
from rlplane.config.schema import RunConfig
from rlplane.recipes.common import (
    TRAIN_PARTITION,
    Timer,
    collect_rollouts,
    masks_and_logprobs,
    rollout_metrics,
    run_training,
)
from rlplane.recipes.grpo import TRAIN_FIELDS as GRPO_FIELDS
from rlplane.recipes.setup import Session
from rlplane.utils.metrics import merge_rank_metrics

__all__ = ["TRAIN_FIELDS", "critic_metrics", "mean_over_epochs", "ppo_advantages", "ppo_step", "train"]

# GRPO's columns plus the critic's: values written by the value workers, returns by the driver.
TRAIN_FIELDS = [*GRPO_FIELDS, "values", "returns"]


def ppo_advantages(
    estimator: str,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    values: torch.Tensor | None,
    gae_kwargs: dict,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token advantages and value targets of a PPO step: ``(A, R)``, both (B, T), 0/meaningless off ``mask``.

    ``gae``: :func:`~rlplane.algorithms.compute_gae` (``R = A(λ_value) + V``; ``gae_kwargs`` = the
    ``ppo.adv_estimator`` keys plus the KL-in-reward arguments). ``raw_reward``: ``A_t = r`` on every
    masked token, whitened if asked; no critic, ``R = None``. ``rewards`` (B,), ``mask`` (B, T) =
    ``token_mask · sample_mask``, ``values`` (B, T) V(s_t).
    """
    if estimator == "raw_reward":
        return raw_reward_advantages(rewards, mask, normalize_advantages=gae_kwargs["normalize_advantages"]), None
    return compute_gae(rewards, values, mask, **gae_kwargs)


def mean_over_epochs(per_epoch: list[dict[str, float]]) -> dict[str, float]:
    """Combine the metrics of several training passes: extrema (``*_min``/``*_max``) by min/max,
    everything else (losses, fractions, norms: already global means per pass) by the mean over passes."""
    out: dict[str, float] = {}
    for key in per_epoch[0] if per_epoch else ():
        vals = [m[key] for m in per_epoch if key in m]
        out[key] = min(vals) if key.endswith("_min") else max(vals) if key.endswith("_max") else sum(vals) / len(vals)
    return out


def critic_metrics(per_epoch: list[dict[str, float]]) -> dict[str, float]:
    """The critic's logged metrics from its per-pass :func:`~rlplane.algorithms.value_loss` metrics.

    ``value_loss``, ``vf_clipfrac``, ``value_grad_norm``, ``value_lr``: mean over passes.
    ``values_mean/min/max``, ``returns_mean``, ``returns_std = sqrt(E[R²] − μ_R²)`` and
    ``critic/explained_var = 1 − Var(R − V)/Var(R)`` come from the **first** pass, whose values are
    the ones GAE used (the critic has not yet been fitted to this batch's returns; with several
    global batches per pass, each is scored before its own update).
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


def _advantages_and_returns(s: Session, meta, carry, sample_mask: torch.Tensor) -> dict[str, float]:
    """Read the columns GAE needs, compute ``A`` and ``R``, write them back; returns advantage stats."""
    cfg, est = s.cfg, s.cfg.ppo.adv_estimator
    kl_in_reward = cfg.loss_fn.use_kl_in_reward and cfg.loss_fn.reference_policy_kl_penalty != 0
    fields = ["token_mask"] + ["values"] * s.uses_critic + ["prev_logprobs", "reference_policy_logprobs"] * kl_in_reward
    cols = s.data_plane.get_samples(meta, TRAIN_PARTITION, fields)
    mask = cols["token_mask"].float() * sample_mask[:, None]  # (B, T): trained response tokens
    gae_kwargs = est.gae_kwargs()
    if kl_in_reward:  # r_t −= β·KL_t(prev ‖ ref); the loss's own KL term is then off (clipped_pg_loss)
        lf = cfg.loss_fn
        gae_kwargs.update(
            kl_penalty=lf.reference_policy_kl_penalty, prev_logprobs=cols["prev_logprobs"],
            reference_logprobs=cols["reference_policy_logprobs"], kl_type=lf.reference_policy_kl_type,
            kl_input_clamp_value=lf.kl_input_clamp_value, kl_output_clamp_value=lf.kl_output_clamp_value,
        )
    adv, ret = ppo_advantages(est.name, carry["rewards"], mask, cols.get("values"), gae_kwargs)  # (B, T) each
    lengths = meta.seq_lens
    out = {"advantages": [adv[i, : lengths[i]] for i in range(len(lengths))]}
    if ret is not None:
        out["returns"] = [ret[i, : lengths[i]].float() for i in range(len(lengths))]
    s.data_plane.put_samples(list(meta.sample_ids), TRAIN_PARTITION, out)
    on = mask != 0
    if not on.any():
        return {}
    return {"advantages/mean": float(adv[on].mean()), "advantages/max": float(adv[on].max()),
            "advantages/min": float(adv[on].min())}


def ppo_step(s: Session, step: int) -> dict[str, float]:
    """One PPO step (``step`` counts from 0); returns its metrics (train/*, critic/*, timing/train/*)."""
    cfg, g = s.cfg, s.cfg.ppo
    t_step = time.perf_counter()
    timer = Timer()
    metrics: dict[str, float] = {}
    gbs = cfg.policy.train_global_batch_size

    with timer("refit"):
        s.refit_if_stale()
    s.data_plane.register_partition(TRAIN_PARTITION, TRAIN_FIELDS, g.num_prompts_per_step * g.num_generations_per_prompt)

    # ---- rollout, rewards, dynamic sampling (shared with GRPO) → values → masks, logprobs ------
    meta, carry = collect_rollouts(s, timer, metrics)
    if s.uses_critic:
        with timer("values"):
            s.value_sharded("compute_values", meta)
    meta, sample_mask = masks_and_logprobs(s, meta, carry, timer, metrics)

    # ---- advantages and returns (token level) -------------------------------------------------
    with timer("advantages"):
        metrics.update(_advantages_and_returns(s, meta, carry, sample_mask))

    # ---- ppo_epochs × (critic, then actor) ----------------------------------------------------
    train_actor = step >= g.policy_training_start_step
    critic, actor = [], []
    for _ in range(g.ppo_epochs):
        if s.uses_critic:
            with timer("value_training"):
                critic.append(merge_rank_metrics(s.value_sharded("train", meta, batch_size=gbs)))
        if train_actor:
            with timer("policy_training"):
                actor.append(merge_rank_metrics(
                    s.policy_sharded("train", meta, batch_size=gbs, loss_kwargs=s.loss_kwargs)))
    if train_actor:
        s.mark_stale()
    s.data_plane.clear_samples(None, TRAIN_PARTITION, wait=False)  # the step is over: do not wait on the store

    metrics.update(mean_over_epochs(actor))
    cm = critic_metrics(critic)
    explained = cm.pop("critic/explained_var", None)
    metrics.update(cm)
    metrics["policy_trained"] = float(train_actor)
    metrics.update(rollout_metrics(carry, meta.seq_lens))
    out = {f"train/{k}": v for k, v in metrics.items()}
    if explained is not None:
        out["critic/explained_var"] = explained
    out.update({f"timing/train/{k}": v for k, v in timer.times.items()})
    out["timing/train/total_step_time"] = time.perf_counter() - t_step
    return out


def train(cfg: RunConfig, *, quiet: bool = False) -> dict:
    """Run the whole job: warm-up (or resume), PPO steps, validation, checkpoints. Returns a summary."""
    if cfg.algorithm != "ppo":
        raise ValueError(f"recipes.ppo.train needs algorithm: ppo, got {cfg.algorithm!r}")
    return run_training(cfg, ppo_step, quiet=quiet)
