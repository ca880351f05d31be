"""Each cross-section rule (``config/rules.py``) on one config that keeps it and one that breaks it,
with the exact line it reports; and RunConfig runs them all, every line at once, in order."""

from __future__ import annotations

import pytest

from rlplane.config import rules
from rlplane.config.loading import ConfigError, build_config
from rlplane.config.loops import PPOConfig

RAY = {"runtime": "ray", "data_plane.backend": "ray"}
ASYNC = {"grpo.async_grpo.enabled": True, "loss_fn.use_importance_sampling_correction": True}
KL_IN_REWARD = {"loss_fn.use_kl_in_reward": True, "grpo.adv_estimator.name": "reinforce_plus_plus"}
FSDP = {"policy.dtensor_cfg.enabled": True, **RAY}
THRESHOLD = {"grpo.stop_at_validation_metric": "accuracy", "grpo.stop_at_validation_threshold": 0.5}

# (rule, algorithm, a config that keeps it, the changes that break it, the line it reports).
# Configs are dotted keys over the defaults (32 prompts x 8 generations = 256 samples, batch 256).
CASES = [
    (rules.positive_nll_not_in_recipes, "grpo", {"loss_fn.positive_example_nll_weight": 0.0},
     {"loss_fn.positive_example_nll_weight": 0.1},
     "loss_fn.positive_example_nll_weight = 0.1: the GRPO and PPO trainers do not pass per-sample rewards to the "
     "policy workers' loss, so this term cannot be computed; set it to 0"),
    (rules.foreign_sections, "grpo", {}, {"ppo": {"ppo_epochs": 2}},
     "ppo.ppo_epochs: PPO-only keys with algorithm = grpo; remove them (or set algorithm=ppo)"),
    (rules.foreign_sections, "grpo", {}, {"ppo": {"num_prompts_per_step": 4}},
     "ppo.num_prompts_per_step: with algorithm = grpo the loop settings live under grpo.*; use "
     "grpo.num_prompts_per_step (or set algorithm=ppo)"),
    (rules.batch_divides_samples, "grpo", {"policy.train_global_batch_size": 128},
     {"policy.train_global_batch_size": 96},
     "policy.train_global_batch_size = 96 does not divide grpo.num_prompts_per_step × num_generations_per_prompt "
     "= 256; make it a divisor (e.g. 256)"),
    (rules.batch_splits_over_ranks, "grpo", {"policy.dp_size": 2, **RAY}, {"policy.dp_size": 3, **RAY},
     "policy.train_global_batch_size = 256 is not divisible by policy.dp_size = 3; make it a multiple"),
    (rules.batch_splits_over_ranks, "grpo", {"policy.train_micro_batch_size": 128},
     {"policy.train_micro_batch_size": 100},
     "policy.train_micro_batch_size = 100 does not divide the per-rank batch 256 (= train_global_batch_size / "
     "dp_size); pick a divisor"),
    (rules.lora_without_warmup, "grpo", {"policy.lora.enabled": True, "warmup.enabled": False},
     {"warmup.enabled": True},
     "policy.lora.enabled with warmup.enabled: the warm-up trains every weight, which an adapter checkpoint does "
     "not hold; set warmup.enabled=false (or policy.lora.enabled=false)"),
    (rules.driver_index_needs_ray_plane, "grpo", {"data_plane.index": "driver", "data_plane.backend": "ray"},
     {"data_plane.backend": "memory"},
     "data_plane.index = driver needs data_plane.backend = ray (the memory plane's index is in the driver "
     "already); set data_plane.backend=ray or data_plane.index=store"),
    (rules.driver_index_not_async, "grpo", {"data_plane.index": "store", "data_plane.backend": "ray", **ASYNC},
     {"data_plane.index": "driver"},
     "data_plane.index = driver with grpo.async_grpo.enabled: the async collector reads and clears keys in its "
     "own process, which needs the store actor; set data_plane.index=store"),
    (rules.ray_runtime_needs_ray_plane, "grpo", RAY, {"data_plane.backend": "memory"},
     "runtime: ray needs data_plane.backend: ray (workers in other processes cannot see in-process memory); set "
     "data_plane.backend=ray"),
    (rules.response_fits_sequence, "grpo", {"policy.generation.max_new_tokens": 31},
     {"policy.generation.max_new_tokens": 32},
     "policy.generation.max_new_tokens = 32 leaves no room for a prompt in policy.max_total_sequence_length = 32 "
     "(prompt + response); raise max_total_sequence_length above max_new_tokens + the longest prompt, or lower "
     "max_new_tokens"),
    (rules.one_token_budget, "grpo", {"policy.dynamic_batching.enabled": True},
     {"policy.sequence_packing.enabled": True},
     "policy.dynamic_batching.enabled and policy.sequence_packing.enabled are exclusive (NeMo RL's rule: both "
     "decide the micro-batches); disable one of them"),
    (rules.dynamic_batching_budget, "grpo",
     {"policy.dynamic_batching.enabled": True, "policy.dynamic_batching.train_mb_tokens": 32},
     {"policy.dynamic_batching.train_mb_tokens": 16},
     "policy.dynamic_batching.train_mb_tokens = 16 < policy.max_total_sequence_length = 32: the longest sequence "
     "must fit one micro-batch; raise it (or leave it null)"),
    (rules.dynamic_batching_budget, "grpo", {"policy.dynamic_batching.enabled": True, "policy.dp_size": 2, **RAY},
     {"policy.dtensor_cfg.enabled": True},
     "policy.dynamic_batching.enabled with policy.dtensor_cfg.enabled: ranks would run different numbers of "
     "training forwards, which FSDP's collectives cannot; disable one of them"),
    (rules.sequence_packing_budget, "grpo", {"policy.sequence_packing.enabled": True},
     {"policy.sequence_packing.logprob_mb_tokens": 8},
     "policy.sequence_packing.logprob_mb_tokens = 8 < policy.max_total_sequence_length = 32: the longest sequence "
     "must fit one micro-batch; raise it (or leave it null)"),
    (rules.fsdp_without_lora, "grpo", {**FSDP, "warmup.enabled": False}, {"policy.lora.enabled": True},
     "policy.dtensor_cfg.enabled with policy.lora.enabled is not supported yet (the adapter refit and checkpoints "
     "assume an unsharded model); disable one of them"),
    (rules.cpu_offload_needs_fsdp, "grpo", {**FSDP, "policy.dtensor_cfg.cpu_offload": True},
     {"policy.dtensor_cfg.enabled": False},
     "policy.dtensor_cfg.cpu_offload = true offloads FSDP2 shards; an unsharded rank has none: set "
     "policy.dtensor_cfg.enabled=true (runtime=ray) or cpu_offload=false"),
    (rules.fsdp_needs_ray, "grpo", FSDP, {"runtime": "local"},
     "policy.dtensor_cfg.enabled needs runtime: ray (the in-process generator shares the policy's unsharded "
     "module); set runtime=ray or policy.dtensor_cfg.enabled=false"),
    (rules.fsdp_not_async, "grpo", {**RAY, **ASYNC}, {"policy.dtensor_cfg.enabled": True},
     "policy.dtensor_cfg.enabled is not supported with grpo.async_grpo.enabled (the collector refits from rank 0 "
     "alone, an FSDP gather needs every rank); disable one of them"),
    (rules.dp_needs_ray, "grpo", {"policy.dp_size": 2, **RAY}, {"runtime": "local", "data_plane.backend": "memory"},
     "policy.dp_size = 2 needs runtime: ray; set runtime=ray or policy.dp_size=1"),
    (rules.groups_need_two, "grpo", {"grpo.num_generations_per_prompt": 2, "policy.train_global_batch_size": 32},
     {"grpo.num_generations_per_prompt": 1},
     "grpo.num_generations_per_prompt = 1: a group of one response has advantage 0 under grpo.adv_estimator.name = "
     "grpo (nothing is learned); use 2 or more, or grpo.adv_estimator.name=reinforce_plus_plus"),
    (rules.kl_in_reward_needs_estimator, "grpo", KL_IN_REWARD, {"grpo.adv_estimator.name": "grpo"},
     "loss_fn.use_kl_in_reward puts the KL in the reward of reinforce_plus_plus (or PPO's GAE); with "
     "grpo.adv_estimator.name = grpo the KL would be dropped; set loss_fn.use_kl_in_reward=false or "
     "grpo.adv_estimator.name=reinforce_plus_plus"),
    (rules.kl_in_reward_needs_prev, "grpo", KL_IN_REWARD, {"loss_fn.force_on_policy_ratio": True},
     "loss_fn.use_kl_in_reward needs prev logprobs, which loss_fn.force_on_policy_ratio skips; unset one of them"),
    (rules.logprob_filter_needs_prev, "grpo", {"grpo.seq_logprob_error_threshold": 2.0},
     {"loss_fn.force_on_policy_ratio": True},
     "grpo.seq_logprob_error_threshold needs prev logprobs, which loss_fn.force_on_policy_ratio skips; unset one "
     "of them"),
    (rules.on_policy_ratio_one_step, "grpo", {"loss_fn.force_on_policy_ratio": True},
     {"policy.train_global_batch_size": 128},
     "loss_fn.force_on_policy_ratio needs one optimizer step per rollout: set policy.train_global_batch_size = "
     "256 (prompts × generations)"),
    (rules.kl_in_reward_needs_reference, "grpo", KL_IN_REWARD,
     {"grpo.skip_reference_policy_logprobs_calculation": True},
     "loss_fn.use_kl_in_reward needs reference logprobs, which grpo.skip_reference_policy_logprobs_calculation "
     "skips; unset one of them"),
    (rules.kl_penalty_needs_reference, "grpo",
     {"grpo.skip_reference_policy_logprobs_calculation": True, "loss_fn.reference_policy_kl_penalty": 0},
     {"loss_fn.reference_policy_kl_penalty": 0.01},
     "grpo.skip_reference_policy_logprobs_calculation with loss_fn.reference_policy_kl_penalty = 0.01: the loss's "
     "KL term needs reference logprobs; set loss_fn.reference_policy_kl_penalty=0 or "
     "grpo.skip_reference_policy_logprobs_calculation=false"),
    (rules.kl_penalty_needs_reference, "ppo",
     {"ppo.skip_reference_policy_logprobs_calculation": True, "loss_fn.reference_policy_kl_penalty": 0},
     {"loss_fn.reference_policy_kl_penalty": 0.05},
     "ppo.skip_reference_policy_logprobs_calculation with loss_fn.reference_policy_kl_penalty = 0.05: the loss's "
     "KL term needs reference logprobs; set loss_fn.reference_policy_kl_penalty=0 or "
     "ppo.skip_reference_policy_logprobs_calculation=false"),
    (rules.on_policy_ratio_one_epoch, "ppo", {"loss_fn.force_on_policy_ratio": True, "ppo.ppo_epochs": 1},
     {"ppo.ppo_epochs": 4},
     "loss_fn.force_on_policy_ratio needs one optimizer step per rollout, but ppo.ppo_epochs = 4; set "
     "ppo.ppo_epochs=1 or loss_fn.force_on_policy_ratio=false"),
    (rules.distillation_one_step, "distillation", {"loss_fn.kl_type": "sampled_reverse"},
     {"policy.train_global_batch_size": 128},
     "loss_fn.kl_type = sampled_reverse needs one optimizer step per rollout (the sampled reverse KL is on-policy only "
     "for the weights that sampled it): set policy.train_global_batch_size = 256 (prompts × generations), or a top-k "
     "kl_type (forward, reverse, mixed)"),
    (rules.distillation_loss_keys, "grpo", {}, {"loss_fn.kl_type": "forward", "loss_fn.mixed_kl_weight": 0.3},
     "loss_fn.{kl_type, mixed_kl_weight}: distillation's loss keys with algorithm = grpo; remove them (or set "
     "algorithm=distillation)"),
    (rules.async_needs_is_correction, "grpo", ASYNC, {"loss_fn.use_importance_sampling_correction": False},
     "grpo.async_grpo.enabled needs loss_fn.use_importance_sampling_correction=true (trajectories come from older "
     "weights; the IS weight π_old/π_gen corrects for it); set it to true"),
    (rules.async_without_dynamic_sampling, "grpo", ASYNC, {"grpo.use_dynamic_sampling": True},
     "grpo.use_dynamic_sampling cannot run with grpo.async_grpo.enabled (the collector serves whole steps ahead "
     "of time, there is no refill); set one of them to false"),
    (rules.async_one_generator, "grpo", ASYNC, {"policy.generation.num_generators": 2},
     "policy.generation.num_generators = 2 with grpo.async_grpo.enabled: the async collector is one generator; "
     "set num_generators=1"),
    (rules.validation_metric_known, "ppo", {"early_stop.enabled": True, "ppo.val_num_generations_per_prompt": 4,
                                            "early_stop.metric": "pass@4"}, {"early_stop.metric": "pass@8"},
     "early_stop.metric = 'pass@8': validation logs no such metric; use accuracy or pass@4 or an environment's "
     "env/<task>/<name>"),
    (rules.validation_metric_known, "grpo", THRESHOLD, {"grpo.stop_at_validation_threshold": float("nan")},
     "grpo.stop_at_validation_threshold = nan: no validation reaches it; give a number"),
    (rules.early_stop_needs_validation, "ppo", {"early_stop.enabled": True, "ppo.val_period": 5},
     {"ppo.val_period": 0},
     "early_stop.enabled with ppo.val_period = 0: no validation runs during the run, so early stop could never "
     "stop it; set ppo.val_period=N (validate every N steps) or turn early stop off"),
]

# backend: vllm cannot load where vllm is not installed: these configs are made without validation.
VLLM = {"policy.generation.backend": "vllm"}
UNVALIDATED_CASES = [
    (rules.vllm_cfg_fits_device, "grpo", VLLM, {"policy.generation.vllm_cfg.tensor_parallel_size": 2},
     "policy.generation.vllm_cfg.tensor_parallel_size = 2 with policy.device = cpu: vLLM shards a model over GPUs "
     "only (the CPU build runs one rank); set tensor_parallel_size=1 or policy.device=cuda"),
    (rules.async_without_vllm_sleep, "grpo", {**ASYNC, **VLLM}, {"policy.generation.vllm_cfg.enable_sleep_mode": True},
     "policy.generation.vllm_cfg.enable_sleep_mode cannot run with grpo.async_grpo.enabled (the collector "
     "generates while the policy trains, so the engine never sleeps); set it to false"),
]


def _tree(algorithm: str, changes: dict) -> dict:
    tree: dict = {"algorithm": algorithm}
    for dotted, value in changes.items():
        node = tree
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return tree


def _unvalidated(model, changes: dict):
    """``model`` with ``changes`` applied by copying (pydantic's ``model_copy`` runs no validator)."""
    for dotted, value in changes.items():
        model = _copy_with(model, dotted.split("."), value)
    return model


def _copy_with(model, path: list[str], value):
    if len(path) == 1:
        value = PPOConfig(**value) if path == ["ppo"] else value
        return model.model_copy(update={path[0]: value})
    return model.model_copy(update={path[0]: _copy_with(getattr(model, path[0]), path[1:], value)})


def _id(case) -> str:
    return case[0].__name__


@pytest.mark.parametrize("rule, algorithm, good, bad, line", CASES, ids=[_id(c) for c in CASES])
def test_rule_keeps_a_good_config_and_reports_a_bad_one(rule, algorithm, good, bad, line):
    cfg = build_config(_tree(algorithm, good))
    assert rule(cfg) == []
    assert rule(_unvalidated(cfg, bad)) == [line]
    with pytest.raises(ConfigError) as e:  # and loading reports it, one line among the config's problems
        build_config(_tree(algorithm, {**good, **bad}))
    assert line in e.value.problems


@pytest.mark.parametrize("rule, algorithm, good, bad, line", UNVALIDATED_CASES,
                         ids=[_id(c) for c in UNVALIDATED_CASES])
def test_rule_on_configs_that_cannot_load_here(rule, algorithm, good, bad, line):
    base = build_config(_tree(algorithm, {}))
    cfg = _unvalidated(base, good)
    assert rule(cfg) == []
    assert rule(_unvalidated(cfg, bad)) == [line]


def test_packing_needs_transformers_that_packs(monkeypatch):
    cfg = build_config(_tree("grpo", {"policy.sequence_packing.enabled": True}))
    assert rules.packing_needs_transformers(cfg) == []
    monkeypatch.setattr(rules, "transformers_packs", lambda: False)
    assert rules.packing_needs_transformers(cfg) == [
        "policy.sequence_packing.enabled needs transformers' packed-sequence masks "
        "(masking_utils.find_packed_sequence_indices, transformers >= 4.54); upgrade transformers or use "
        "policy.dynamic_batching instead"]
    assert rules.packing_needs_transformers(build_config(_tree("grpo", {}))) == []


def test_every_rule_has_its_case():
    tested = {c[0] for c in CASES + UNVALIDATED_CASES} | {rules.packing_needs_transformers}
    assert set(rules.SECTION_RULES + rules.RULES) == tested


def test_loading_reports_every_broken_rule_at_once_in_order():
    with pytest.raises(ConfigError) as e:
        build_config(_tree("grpo", {"policy.dp_size": 2, "policy.generation.max_new_tokens": 32}))
    assert e.value.problems == [
        "policy.generation.max_new_tokens = 32 leaves no room for a prompt in policy.max_total_sequence_length = 32 "
        "(prompt + response); raise max_total_sequence_length above max_new_tokens + the longest prompt, or lower "
        "max_new_tokens",
        "policy.dp_size = 2 needs runtime: ray; set runtime=ray or policy.dp_size=1",
    ]


def test_another_algorithms_section_stops_the_other_rules():
    # The batch would not divide either, but with the wrong section the rest would judge the wrong loop.
    with pytest.raises(ConfigError) as e:
        build_config(_tree("grpo", {"ppo.ppo_epochs": 2, "policy.train_global_batch_size": 96}))
    assert e.value.problems == ["ppo.ppo_epochs: PPO-only keys with algorithm = grpo; remove them (or set "
                                "algorithm=ppo)"]
