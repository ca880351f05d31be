"""`data_plane.index: auto` (the default): the driver-held index where the recipe's driver owns every
key, the store actor where another process reads and clears keys (issue 18, the data plane at scale)."""

from __future__ import annotations

import pytest

from rlplane.config.loading import load_config
from rlplane.config.recipes import ASYNC_GRPO, RECIPES
from rlplane.training.plan import data_plane_index

RAY = ["runtime=ray", "data_plane.backend=ray"]
ASYNC = ["grpo.async_grpo.enabled=true", "loss_fn.use_importance_sampling_correction=true"]


@pytest.mark.parametrize("preset, overrides, expected", [
    # Sync GRPO, PPO, distillation: only the driver registers, lists, clears and reads by key list;
    # the rollout, policy, value and teacher workers read the metas it sends and return receipts.
    (None, RAY, "driver"),
    (None, ["data_plane.backend=ray"], "driver"),  # runtime local, ray plane: the workers are in the driver
    ("ppo_arithmetic", RAY, "driver"),
    ("distill_arithmetic", RAY, "driver"),
    # Async GRPO: the collector reads its groups' columns and clears their keys in its own process.
    ("grpo_arithmetic_async", RAY, "store"),
    (None, [*RAY, *ASYNC], "store"),
    ("grpo_arithmetic_async", ["data_plane.backend=ray"], "store"),  # its thread is still not the driver
    # The memory backend's index is in-process: the value is not used, auto reads as store.
    (None, [], "store"),
    ("ppo_arithmetic", [], "store"),
    ("distill_arithmetic", [], "store"),
    ("grpo_arithmetic_async", [], "store"),
    # Set explicitly: taken as it is.
    (None, [*RAY, "data_plane.index=store"], "store"),
    ("ppo_arithmetic", [*RAY, "data_plane.index=store"], "store"),
    ("distill_arithmetic", [*RAY, "data_plane.index=driver"], "driver"),
    ("grpo_arithmetic_async", [*RAY, "data_plane.index=store"], "store"),
])
def test_auto_resolves_per_recipe_and_backend(preset, overrides, expected):
    cfg = load_config(preset, overrides)
    index, why = data_plane_index(cfg)
    assert index == expected, why


def test_auto_is_the_default_and_stays_auto_in_the_config():
    """The choice is derived (printed at start-up), never written back: a saved config keeps `auto`."""
    cfg = load_config(None, RAY)
    assert cfg.data_plane.index == "auto"
    assert data_plane_index(cfg) == ("driver", "recipe grpo: the driver owns every key, its workers read "
                                               "the metas it sends")
    assert data_plane_index(load_config("grpo_arithmetic_async", RAY)) == (
        "store", "recipe async_grpo: a process other than the driver reads and clears keys")


def test_every_recipe_says_whether_its_driver_owns_the_keys():
    assert {r.name: r.driver_owns_keys for r in RECIPES.values()} == {"grpo": True, "ppo": True, "distillation": True}
    assert ASYNC_GRPO.driver_owns_keys is False
