"""Facts about a run that follow from its config alone (no model, no data), for the recipes and
workers to act on. Pure functions of a :class:`RunConfig`."""

from __future__ import annotations

from rlplane.config.recipes import recipe_for
from rlplane.config.schema import RunConfig


def prev_logprobs_are_the_training_forward(cfg: RunConfig) -> bool:
    """Whether the old-policy logprobs of a step equal its training forward's, detached, so the
    separate no-grad prev-logprob forward computes a result that is already known.

    π_old is the policy before the step's first optimizer step. The training forward of the first
    global batch runs at exactly those weights, so when the rollout gets exactly one optimizer step
    its logprobs, detached, *are* π_old's (the ratio is exp(curr − sg(curr)) = 1 with the gradient
    of curr; TRL and NeMo RL's on-policy shortcut do the same). That needs all of:

    - one global batch per rollout: ``num_prompts_per_step × num_generations_per_prompt ==
      policy.train_global_batch_size`` (dynamic sampling refills to that same count);
    - one pass over it: PPO's ``ppo_epochs == 1`` (GRPO trains each rollout once);
    - nothing reads ``prev_logprobs`` before training: not ``seq_logprob_error_threshold`` (the
      driver masks sequences on it) nor the KL in the reward (``use_kl_in_reward`` with β ≠ 0:
      advantages are computed from it);
    - the training forward is the eval-mode forward: no LoRA dropout (the prev forward runs in eval
      mode, the training forward in train mode; the Llama-family models rlplane loads have no
      other dropout at their default config).

    Async GRPO qualifies too: it recomputes the prev logprobs with the trainer's current weights,
    right before training on them. Metrics that compare π_old with the generator
    (``token_mult_prob_error``, ``gen_kl_error``, the IS weights) are then computed from the training
    forward.
    """
    g, p, lf = cfg.loop, cfg.policy, cfg.loss_fn
    one_global_batch = g.num_prompts_per_step * g.num_generations_per_prompt == p.train_global_batch_size
    one_pass = cfg.algorithm != "ppo" or cfg.ppo.ppo_epochs == 1
    read_before_training = g.seq_logprob_error_threshold is not None or (
        lf.use_kl_in_reward and lf.reference_policy_kl_penalty != 0
    )
    dropout = p.lora.enabled and p.lora.dropout > 0
    return one_global_batch and one_pass and not read_before_training and not dropout


def skips_prev_logprob_forward(cfg: RunConfig) -> bool:
    """Whether a step runs no prev-logprob forward: the user forced the on-policy ratio
    (``loss_fn.force_on_policy_ratio``), or :func:`prev_logprobs_are_the_training_forward`.
    The driver (which would call ``compute_logprobs``) and the policy worker (which then takes
    ``prev = curr.detach()``) both ask this, so they cannot disagree."""
    return cfg.loss_fn.force_on_policy_ratio or prev_logprobs_are_the_training_forward(cfg)


def data_plane_index(cfg: RunConfig) -> tuple[str, str]:
    """``(index, why)``: where the ray data plane keeps its key index, ``"driver"`` or ``"store"``, as
    ``data_plane.index`` gives it or as ``auto`` picks it.

    ``auto`` picks ``driver`` (no store-actor round trip per put, read and clear; figures in
    ``docs/benchmarks.md``) when the data
    plane is ``ray`` and the recipe's driver owns every key (:attr:`Recipe.driver_owns_keys`: sync
    GRPO, PPO, distillation); ``store`` when another process reads or clears keys itself (async GRPO's
    collector) and for the ``memory`` backend, whose index is in-process either way (unused there).
    """
    index = cfg.data_plane.index
    if index != "auto":
        return index, "set in the config"
    if cfg.data_plane.backend != "ray":
        return "store", f"data_plane.backend = {cfg.data_plane.backend}: its index is in-process, the choice is unused"
    recipe = recipe_for(cfg)
    name = recipe.train.partition(":")[0].rpartition(".")[2]  # the recipe's module: grpo, async_grpo, ...
    if recipe.driver_owns_keys:
        return "driver", f"recipe {name}: the driver owns every key, its workers read the metas it sends"
    return "store", f"recipe {name}: a process other than the driver reads and clears keys"
