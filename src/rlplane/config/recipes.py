"""The one table of recipes: what ``algorithm:`` may name, the config sections each reads, its ``train``."""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    name: str  # the value of `algorithm:`
    loop: str  # the config section with its loop settings (a RolloutLoopConfig)
    sections: tuple[str, ...]  # other sections only this recipe reads (filled with defaults when chosen)
    train: str  # "module:function" of its entry point, train(cfg, quiet=False) -> summary
    summary: str
    # Only the driver touches keys (workers return receipts), so `data_plane.index: auto` keeps the index there.
    driver_owns_keys: bool


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("grpo", "grpo", (), "rlplane.recipes.grpo:train", "GRPO: group-baseline advantages, clipped PG loss",
           driver_owns_keys=True),
    Recipe("ppo", "ppo", ("value",), "rlplane.recipes.ppo:train", "PPO: value model, GAE, several epochs per rollout",
           driver_owns_keys=True),
    Recipe("distillation", "distillation", ("teacher",), "rlplane.recipes.distillation:train",
           "on-policy distillation: a frozen teacher scores the student's tokens, per-token reverse KL",
           driver_owns_keys=True),
)}
#: GRPO with `grpo.async_grpo.enabled`: its collector reads and clears its groups' keys in its own process.
ASYNC_GRPO = Recipe("grpo", "grpo", (), "rlplane.recipes.async_grpo:train", "asynchronous GRPO",
                    driver_owns_keys=False)


def recipe_for(cfg) -> Recipe:
    """The recipe ``cfg`` runs."""
    recipe = RECIPES[cfg.algorithm]
    loop = getattr(cfg, recipe.loop)
    return ASYNC_GRPO if getattr(getattr(loop, "async_grpo", None), "enabled", False) else recipe


def train_function(recipe: Recipe):
    """Import the recipe's entry point (recipes load lazily: heavy imports only for the one that runs)."""
    module, _, fn = recipe.train.partition(":")
    return getattr(importlib.import_module(module), fn)


def owner_of(section: str) -> str:
    """The recipe whose loop or own sections include ``section``."""
    return next(r.name for r in RECIPES.values() if section == r.loop or section in r.sections)
