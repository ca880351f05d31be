"""Facts about a run that follow from its config alone, as pure functions of a :class:`RunConfig`."""

from __future__ import annotations

from rlplane.config.recipes import recipe_for
from rlplane.config.schema import RunConfig


def prev_logprobs_are_the_training_forward(cfg: RunConfig) -> bool:
    """Whether a step's old-policy logprobs equal its training forward's, detached (prev forward redundant).

    True when the first global batch's training forward runs at π_old's weights and nothing reads prev
    before training: one global batch per rollout (prompts × generations == ``train_global_batch_size``),
    ``ppo_epochs == 1``, no ``seq_logprob_error_threshold``, no KL in the reward, no LoRA dropout (prev runs
    in eval mode). Async GRPO qualifies (it recomputes prev with current weights); the mismatch metrics then
    come from the training forward. TRL and NeMo RL's on-policy shortcut do the same.
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
    """Whether a step runs no prev-logprob forward (``force_on_policy_ratio``, or the above); the driver and
    the policy worker both ask this, so they cannot disagree."""
    return cfg.loss_fn.force_on_policy_ratio or prev_logprobs_are_the_training_forward(cfg)


def data_plane_index(cfg: RunConfig) -> tuple[str, str]:
    """``(index, why)``: where the ray data plane keeps its key index, ``"driver"`` or ``"store"``.

    ``auto``: ``driver`` (no store round trips) when the plane is ``ray`` and the recipe's driver owns every
    key (:attr:`Recipe.driver_owns_keys`), else ``store`` (async GRPO's collector; unused by ``memory``).
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
