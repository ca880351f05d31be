"""The run plan: built once from the config (and the data and cluster found), its role table, sizes, numerics, data
plane and end-of-step jobs, the options each worker is built with, the table printed and plan.yaml written."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from rlplane.config.loading import load_config
from rlplane.training.plan import RAY_CPUS, build_plan

RAY = ["runtime=ray", "data_plane.backend=ray"]
ASYNC = ["grpo.async_grpo.enabled=true", "loss_fn.use_importance_sampling_correction=true"]


@pytest.mark.parametrize("preset, overrides, roles", [
    (None, [], ["policy", "generator"]),
    ("ppo_arithmetic", [], ["policy", "generator", "value"]),  # GAE: a critic
    ("ppo_arithmetic", ["ppo.adv_estimator.name=raw_reward"], ["policy", "generator"]),  # no critic
    ("distill_arithmetic", [], ["policy", "generator", "teacher"]),
    (None, ASYNC, ["policy", "generator", "collector"]),
])
def test_the_role_table_is_the_recipes(preset, overrides, roles):
    plan = build_plan(load_config(preset, overrides))
    assert [r.name for r in plan.roles] == roles
    assert (plan.value is not None) == plan.has("value") and (plan.teacher is not None) == plan.has("teacher")


def test_ray_roles_ask_for_cpus_and_environment_pools_are_roles():
    plan = build_plan(load_config(None, [*RAY, "policy.dp_size=2", "policy.train_global_batch_size=256",
                                         "env.actors_per_env=3", "env.cpus_per_actor=0.25"]), task_names=["arithmetic"])
    asks = {r.name: (r.count, r.cpus) for r in plan.roles}
    assert asks == {"policy": (2, RAY_CPUS["policy"]), "generator": (1, RAY_CPUS["generator"]),
                    "env/arithmetic": (3, 0.25)}
    assert plan.env_pools == {"arithmetic": ("arithmetic", 3)} and plan.placement.slots["policy"]
    local = build_plan(load_config(None, []), task_names=["arithmetic"])
    assert all(r.cpus == 0 for r in local.roles) and local.env_pools == {} and local.placement is None


def test_sizes_are_derived_once():
    cfg = load_config(None, ["grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=4",
                             "policy.train_global_batch_size=8", "policy.train_micro_batch_size=4",
                             "grpo.max_num_steps=50", "grpo.max_num_epochs=2"])
    s = build_plan(cfg, steps_per_epoch=10).sizes
    assert (s.samples_per_step, s.optimizer_steps_per_step, s.train_micro_batch_size) == (16, 2, 4)
    assert s.last_step == 20  # two epochs of ten steps come before max_num_steps
    assert build_plan(cfg).sizes.last_step == 50  # the data's size not known: max_num_steps
    ppo = load_config("ppo_arithmetic", ["ppo.ppo_epochs=3"])
    assert build_plan(ppo).sizes.optimizer_steps_per_step == 3 * max(1, ppo.ppo.samples_per_step()
                                                                         // ppo.policy.train_global_batch_size)


def test_the_weight_check_setting_is_read_once_for_the_driver_and_the_policy_ranks():
    on, off = (build_plan(load_config(None, [f"policy.generation.verify_weights={m}"])) for m in ("warn", "off"))
    assert (on.weight_check.mode, on.policy.fingerprint_sent) == ("warn", True)
    assert (off.weight_check.enabled, off.policy.fingerprint_sent) == (False, False)


def test_numerics_settle_precision_without_loading_the_model():
    plan = build_plan(load_config(None, []))
    assert (plan.numerics.precision, plan.numerics.device) == ("fp32", "cpu")
    assert "hidden_size 128 < 256" in plan.numerics.why
    assert plan.policy.policy.precision == "fp32"  # the workers get the concrete choice
    assert build_plan(load_config(None, ["policy.precision=bf16"])).numerics.why == "set in the config"


def test_the_plan_is_frozen_printed_short_and_written_as_plain_data():
    plan = build_plan(load_config(None, [*RAY]), steps_per_epoch=100)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.seed = 1
    table = plan.table()
    assert len(table.splitlines()) <= 12
    assert "index driver (recipe grpo: the driver owns every key" in table and "end of step  refit every step" in table
    data = yaml.safe_load(yaml.safe_dump(plan.to_dict(), sort_keys=False))  # as the session writes plan.yaml
    assert set(data) == {"recipe", "runtime", "seed", "roles", "sizes", "numerics", "data_plane", "end_of_step",
                         "weight_check"}
    assert list(data["end_of_step"]) == ["refit", "validate", "log", "checkpoint"]
