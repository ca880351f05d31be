"""The rules that tie sections of a run's config together, one small function each.

A rule takes the :class:`~rlplane.config.schema.RunConfig` and returns one-line messages (dotted keys,
values, fix). :data:`SECTION_RULES` run first, then :data:`RULES`; every line is reported at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from rlplane.config.loops import RolloutLoopConfig
from rlplane.config.policy import transformers_packs
from rlplane.config.recipes import RECIPES, owner_of
from rlplane.config.vllm import vllm_cfg_errors

# A rule's argument is the RunConfig; not imported here, since schema.py imports this module.
Rule = Callable[[object], list[str]]


def _samples(cfg) -> int:
    """Samples per step: the loop's prompts × generations."""
    return cfg.loop.samples_per_step()


def _kl_in_reward(cfg) -> bool:
    lf = cfg.loss_fn
    return lf.use_kl_in_reward and lf.reference_policy_kl_penalty != 0


def _async(cfg) -> bool:
    return cfg.algorithm == "grpo" and cfg.grpo.async_grpo.enabled


# ---- the sections of another algorithm -------------------------------------------------------------
def foreign_sections(cfg) -> list[str]:
    """Sections only another algorithm reads are unset; its loop settings belong under this algorithm's loop."""
    errors = []
    algo, mine = cfg.algorithm, (RECIPES[cfg.algorithm].loop, *RECIPES[cfg.algorithm].sections)
    shared = set(RolloutLoopConfig.model_fields)
    others = dict.fromkeys(s for r in RECIPES.values() for s in (r.loop, *r.sections) if s not in mine)
    for section in others:
        given = getattr(cfg, section)
        if given is None:
            continue
        other_algo = owner_of(section)
        keys = sorted(given.model_fields_set)
        moved = [k for k in keys if section == RECIPES[other_algo].loop and k in shared]
        only = [k for k in keys if k not in moved]
        if moved:
            errors.append(
                f"{', '.join(f'{section}.{k}' for k in moved)}: with algorithm = {algo} the loop settings live "
                f"under {algo}.*; use {', '.join(f'{algo}.{k}' for k in moved)} (or set algorithm={other_algo})"
            )
        if only or not moved:
            errors.append(
                f"{', '.join(f'{section}.{k}' for k in only) or section}: "
                f"{other_algo.upper()}-only keys with algorithm = "
                f"{algo}; remove them (or set algorithm={other_algo})"
            )
    return errors


# ---- batch sizes -----------------------------------------------------------------------------------
def batch_divides_samples(cfg) -> list[str]:
    p, samples = cfg.policy, _samples(cfg)
    if samples % p.train_global_batch_size:
        return [f"policy.train_global_batch_size = {p.train_global_batch_size} does not divide "
                f"{cfg.algorithm}.num_prompts_per_step × num_generations_per_prompt "
                f"= {samples}; make it a divisor (e.g. {samples})"]
    return []


def batch_splits_over_ranks(cfg) -> list[str]:
    """The global batch splits evenly over the DP ranks, and each rank's share into micro-batches."""
    p = cfg.policy
    per_rank = p.train_global_batch_size // p.dp_size
    if p.train_global_batch_size % p.dp_size:
        return [f"policy.train_global_batch_size = {p.train_global_batch_size} is not divisible by "
                f"policy.dp_size = {p.dp_size}; make it a multiple"]
    if per_rank % min(p.train_micro_batch_size, per_rank):
        return [f"policy.train_micro_batch_size = {p.train_micro_batch_size} does not divide the per-rank batch "
                f"{per_rank} (= train_global_batch_size / dp_size); pick a divisor"]
    return []


def response_fits_sequence(cfg) -> list[str]:
    """A prompt has at least one token, so a response never gets max_new_tokens: it would be cut silently."""
    p = cfg.policy
    if p.generation.max_new_tokens >= p.max_total_sequence_length:
        return [f"policy.generation.max_new_tokens = {p.generation.max_new_tokens} leaves no room for a prompt in "
                f"policy.max_total_sequence_length = {p.max_total_sequence_length} (prompt + response); raise "
                f"max_total_sequence_length above max_new_tokens + the longest prompt, or lower max_new_tokens"]
    return []


# ---- where things run ------------------------------------------------------------------------------
def lora_without_warmup(cfg) -> list[str]:
    if cfg.policy.lora.enabled and cfg.warmup.enabled:
        return ["policy.lora.enabled with warmup.enabled: the warm-up trains every weight, which an adapter "
                "checkpoint does not hold; set warmup.enabled=false (or policy.lora.enabled=false)"]
    return []


def driver_index_needs_ray_plane(cfg) -> list[str]:
    if cfg.data_plane.index == "driver" and cfg.data_plane.backend != "ray":
        return ["data_plane.index = driver needs data_plane.backend = ray (the memory plane's index is in "
                "the driver already); set data_plane.backend=ray or data_plane.index=store"]
    return []


def driver_index_not_async(cfg) -> list[str]:
    if cfg.data_plane.index == "driver" and cfg.grpo is not None and cfg.grpo.async_grpo.enabled:
        return ["data_plane.index = driver with grpo.async_grpo.enabled: the async collector reads and "
                "clears keys in its own process, which needs the store actor; set data_plane.index=store"]
    return []


def ray_runtime_needs_ray_plane(cfg) -> list[str]:
    if cfg.runtime == "ray" and cfg.data_plane.backend == "memory":
        return ["runtime: ray needs data_plane.backend: ray (workers in other processes cannot see "
                "in-process memory); set data_plane.backend=ray"]
    return []


def dp_needs_ray(cfg) -> list[str]:
    p = cfg.policy
    if p.dp_size > 1 and cfg.runtime == "local":
        return [f"policy.dp_size = {p.dp_size} needs runtime: ray; set runtime=ray or policy.dp_size=1"]
    return []


# ---- micro-batches cut by tokens -------------------------------------------------------------------
def one_token_budget(cfg) -> list[str]:
    p = cfg.policy
    if p.dynamic_batching.enabled and p.sequence_packing.enabled:
        return ["policy.dynamic_batching.enabled and policy.sequence_packing.enabled are exclusive (NeMo "
                "RL's rule: both decide the micro-batches); disable one of them"]
    return []


def packing_needs_transformers(cfg) -> list[str]:
    if cfg.policy.sequence_packing.enabled and not transformers_packs():
        return ["policy.sequence_packing.enabled needs transformers' packed-sequence masks "
                "(masking_utils.find_packed_sequence_indices, transformers >= 4.54); upgrade "
                "transformers or use policy.dynamic_batching instead"]
    return []


def _token_budget_rule(key: str) -> Rule:
    """``policy.<key>`` (a token budget): not with FSDP over several ranks, and the longest sequence fits."""

    def rule(cfg) -> list[str]:
        p, errors = cfg.policy, []
        tb = getattr(p, key)
        if tb.enabled and p.dtensor_cfg.enabled and p.dp_size > 1:
            errors.append(f"policy.{key}.enabled with policy.dtensor_cfg.enabled: ranks would run different "
                          "numbers of training forwards, which FSDP's collectives cannot; disable one of them")
        for budget in ("train_mb_tokens", "logprob_mb_tokens"):
            value = getattr(tb, budget)
            if tb.enabled and value is not None and value < p.max_total_sequence_length:
                errors.append(f"policy.{key}.{budget} = {value} < policy.max_total_sequence_length = "
                              f"{p.max_total_sequence_length}: the longest sequence must fit one micro-batch; "
                              f"raise it (or leave it null)")
        return errors

    rule.__name__ = rule.__qualname__ = f"{key}_budget"
    return rule


dynamic_batching_budget = _token_budget_rule("dynamic_batching")
sequence_packing_budget = _token_budget_rule("sequence_packing")


# ---- FSDP ------------------------------------------------------------------------------------------
def fsdp_without_lora(cfg) -> list[str]:
    if cfg.policy.dtensor_cfg.enabled and cfg.policy.lora.enabled:
        return ["policy.dtensor_cfg.enabled with policy.lora.enabled is not supported yet (the adapter "
                "refit and checkpoints assume an unsharded model); disable one of them"]
    return []


def cpu_offload_needs_fsdp(cfg) -> list[str]:
    d = cfg.policy.dtensor_cfg
    if d.cpu_offload and not d.enabled:
        return ["policy.dtensor_cfg.cpu_offload = true offloads FSDP2 shards; an unsharded rank has none: set "
                "policy.dtensor_cfg.enabled=true (runtime=ray) or cpu_offload=false"]
    return []


def fsdp_needs_ray(cfg) -> list[str]:
    if cfg.policy.dtensor_cfg.enabled and cfg.runtime == "local":
        return ["policy.dtensor_cfg.enabled needs runtime: ray (the in-process generator shares the "
                "policy's unsharded module); set runtime=ray or policy.dtensor_cfg.enabled=false"]
    return []


def fsdp_not_async(cfg) -> list[str]:
    if cfg.policy.dtensor_cfg.enabled and _async(cfg):
        return ["policy.dtensor_cfg.enabled is not supported with grpo.async_grpo.enabled (the collector "
                "refits from rank 0 alone, an FSDP gather needs every rank); disable one of them"]
    return []


def vllm_cfg_fits_device(cfg) -> list[str]:
    """GPU-only engine features with ``policy.device: cpu`` (:func:`~rlplane.config.vllm.vllm_cfg_errors`)."""
    p = cfg.policy
    return vllm_cfg_errors(p.device, p.generation.vllm_cfg) if p.generation.backend == "vllm" else []


# ---- GRPO's advantage estimator (GDPO's need for reward components: training/advantages.py, where the
# environments are known) -------------------------------------------------------------------------------
def groups_need_two(cfg) -> list[str]:
    """A group of one response is its own baseline: advantage 0 under every group estimator."""
    g = cfg.grpo if cfg.algorithm == "grpo" else None
    if g is not None and g.num_generations_per_prompt == 1 and g.adv_estimator.name != "reinforce_plus_plus":
        return [f"grpo.num_generations_per_prompt = 1: a group of one response has advantage 0 under "
                f"grpo.adv_estimator.name = {g.adv_estimator.name} (nothing is learned); use 2 or more, "
                "or grpo.adv_estimator.name=reinforce_plus_plus"]
    return []


def kl_in_reward_needs_estimator(cfg) -> list[str]:
    est = cfg.grpo.adv_estimator if cfg.algorithm == "grpo" else None
    if est is not None and _kl_in_reward(cfg) and est.name != "reinforce_plus_plus":
        return [f"loss_fn.use_kl_in_reward puts the KL in the reward of reinforce_plus_plus (or PPO's GAE); with "
                f"grpo.adv_estimator.name = {est.name} the KL would be dropped; set loss_fn.use_kl_in_reward=false "
                "or grpo.adv_estimator.name=reinforce_plus_plus"]
    return []


def kl_in_reward_needs_prev(cfg) -> list[str]:
    if cfg.algorithm == "grpo" and _kl_in_reward(cfg) and cfg.loss_fn.force_on_policy_ratio:
        return ["loss_fn.use_kl_in_reward needs prev logprobs, which "
                "loss_fn.force_on_policy_ratio skips; unset one of them"]
    return []


# ---- what the loss reads ---------------------------------------------------------------------------
def logprob_filter_needs_prev(cfg) -> list[str]:
    if cfg.loop.seq_logprob_error_threshold is not None and cfg.loss_fn.force_on_policy_ratio:
        return [f"{cfg.algorithm}.seq_logprob_error_threshold needs prev logprobs, which "
                "loss_fn.force_on_policy_ratio "
                "skips; unset one of them"]
    return []


def on_policy_ratio_one_step(cfg) -> list[str]:
    samples = _samples(cfg)
    if cfg.loss_fn.force_on_policy_ratio and samples != cfg.policy.train_global_batch_size:
        return ["loss_fn.force_on_policy_ratio needs one optimizer step per rollout: set "
                f"policy.train_global_batch_size = {samples} (prompts × generations)"]
    return []


def kl_in_reward_needs_reference(cfg) -> list[str]:
    if _kl_in_reward(cfg) and cfg.loop.skip_reference_policy_logprobs_calculation:
        return ["loss_fn.use_kl_in_reward needs reference logprobs, which "
                f"{cfg.algorithm}.skip_reference_policy_logprobs_calculation skips; unset one of them"]
    return []


def kl_penalty_needs_reference(cfg) -> list[str]:
    """The loss's KL term (β ≠ 0, not moved into the reward) reads the reference logprobs the skip leaves out."""
    lf, loop = cfg.loss_fn, cfg.loop
    if (cfg.algorithm in ("grpo", "ppo") and loop.skip_reference_policy_logprobs_calculation
            and lf.reference_policy_kl_penalty != 0 and not lf.use_kl_in_reward):
        return [f"{cfg.algorithm}.skip_reference_policy_logprobs_calculation with "
                f"loss_fn.reference_policy_kl_penalty = {lf.reference_policy_kl_penalty}: the loss's KL term needs "
                f"reference logprobs; set loss_fn.reference_policy_kl_penalty=0 or "
                f"{cfg.algorithm}.skip_reference_policy_logprobs_calculation=false"]
    return []


def on_policy_ratio_one_epoch(cfg) -> list[str]:
    if cfg.loss_fn.force_on_policy_ratio and cfg.algorithm == "ppo" and cfg.ppo.ppo_epochs > 1:
        return [f"loss_fn.force_on_policy_ratio needs one optimizer step per rollout, but ppo.ppo_epochs = "
                f"{cfg.ppo.ppo_epochs}; set ppo.ppo_epochs=1 or loss_fn.force_on_policy_ratio=false"]
    return []


def distillation_one_step(cfg) -> list[str]:
    samples = _samples(cfg)
    sampled = cfg.loss_fn.kl_type == "sampled_reverse"
    if cfg.algorithm == "distillation" and sampled and samples != cfg.policy.train_global_batch_size:
        return ["loss_fn.kl_type = sampled_reverse needs one optimizer step per rollout (the sampled reverse KL is "
                f"on-policy only for the weights that sampled it): set policy.train_global_batch_size = {samples} "
                "(prompts × generations), or a top-k kl_type (forward, reverse, mixed)"]
    return []


def distillation_loss_keys(cfg) -> list[str]:
    """``loss_fn``'s distillation keys changed with another algorithm: they would do nothing."""
    from rlplane.algorithms.loss_options import DistillationLossOptions

    if cfg.algorithm == "distillation":
        return []
    default = DistillationLossOptions()
    changed = [k for k in ("kl_type", "mixed_kl_weight", "zero_outside_topk")
               if getattr(cfg.loss_fn, k) != getattr(default, k)]
    if changed:
        return [f"loss_fn.{{{', '.join(changed)}}}: distillation's loss keys with algorithm = {cfg.algorithm}; remove "
                "them (or set algorithm=distillation)"]
    return []


# ---- asynchronous GRPO (NeMo RL asserts the first two as well) ---------------------------------------
def async_needs_is_correction(cfg) -> list[str]:
    if _async(cfg) and not cfg.loss_fn.use_importance_sampling_correction:
        return ["grpo.async_grpo.enabled needs loss_fn.use_importance_sampling_correction=true (trajectories "
                "come from older weights; the IS weight π_old/π_gen corrects for it); set it to true"]
    return []


def async_without_dynamic_sampling(cfg) -> list[str]:
    if _async(cfg) and cfg.grpo.use_dynamic_sampling:
        return ["grpo.use_dynamic_sampling cannot run with grpo.async_grpo.enabled (the collector serves whole "
                "steps ahead of time, there is no refill); set one of them to false"]
    return []


def async_without_vllm_sleep(cfg) -> list[str]:
    gen = cfg.policy.generation
    if _async(cfg) and gen.backend == "vllm" and gen.vllm_cfg.enable_sleep_mode:
        return ["policy.generation.vllm_cfg.enable_sleep_mode cannot run with grpo.async_grpo.enabled (the "
                "collector generates while the policy trains, so the engine never sleeps); set it to false"]
    return []


def async_one_generator(cfg) -> list[str]:
    n = cfg.policy.generation.num_generators
    if _async(cfg) and n > 1:
        return [f"policy.generation.num_generators = {n} with "
                "grpo.async_grpo.enabled: the async collector is one generator; set num_generators=1"]
    return []


def validation_metric_known(cfg) -> list[str]:
    """The metric an early stop watches is one validation logs (a misspelt one never stops the run), and the
    threshold is a number (NaN is never reached)."""
    loop, key = cfg.loop, RECIPES[cfg.algorithm].loop
    k = loop.val_num_generations_per_prompt
    known = ["accuracy", *([f"pass@{k}"] if k > 1 else [])]
    watched = [("early_stop.metric", cfg.early_stop.metric)] if cfg.early_stop.enabled else []
    if loop.stop_at_validation_metric is not None:
        watched.append((f"{key}.stop_at_validation_metric", loop.stop_at_validation_metric))
    errors = []
    for where, name in watched:
        bare = name.removeprefix("validation/")
        if bare in known or (bare.startswith("env/") and bare.count("/") >= 2):
            continue
        hint = f" (pass@k needs {key}.val_num_generations_per_prompt > 1)" if bare.startswith("pass") and k == 1 else ""
        errors.append(f"{where} = {name!r}: validation logs no such metric; use {' or '.join(known)} or an "
                      f"environment's env/<task>/<name>{hint}")
    if loop.stop_at_validation_threshold is not None and math.isnan(loop.stop_at_validation_threshold):
        errors.append(f"{key}.stop_at_validation_threshold = nan: no validation reaches it; give a number")
    return errors


def early_stop_needs_validation(cfg) -> list[str]:
    """Early stop judges each validation during the run: with none (``val_period`` 0) it is on and never acts."""
    key = RECIPES[cfg.algorithm].loop
    if cfg.early_stop.enabled and cfg.loop.val_period == 0:
        return [f"early_stop.enabled with {key}.val_period = 0: no validation runs during the run, so early stop "
                f"could never stop it; set {key}.val_period=N (validate every N steps) or turn early stop off"]
    return []


def positive_nll_not_in_recipes(cfg) -> list[str]:
    """VAPO's positive-example NLL needs each sample's reward and the global count of positive tokens inside the
    loss; the recipes hand the policy workers advantages only, so the term would fail mid-step."""
    w = cfg.loss_fn.positive_example_nll_weight
    if w > 0:
        return [f"loss_fn.positive_example_nll_weight = {w}: the GRPO and PPO trainers do not pass per-sample "
                "rewards to the policy workers' loss, so this term cannot be computed; set it to 0"]
    return []


#: Run first: when one finds something, the rest are not run (they would judge the wrong section).
SECTION_RULES: list[Rule] = [foreign_sections]

#: Every other cross-section rule, in the order their lines are reported.
RULES: list[Rule] = [
    batch_divides_samples,
    batch_splits_over_ranks,
    lora_without_warmup,
    driver_index_needs_ray_plane,
    driver_index_not_async,
    ray_runtime_needs_ray_plane,
    response_fits_sequence,
    one_token_budget,
    packing_needs_transformers,
    dynamic_batching_budget,
    sequence_packing_budget,
    fsdp_without_lora,
    cpu_offload_needs_fsdp,
    fsdp_needs_ray,
    fsdp_not_async,
    vllm_cfg_fits_device,
    dp_needs_ray,
    groups_need_two,
    kl_in_reward_needs_estimator,
    kl_in_reward_needs_prev,
    logprob_filter_needs_prev,
    on_policy_ratio_one_step,
    kl_in_reward_needs_reference,
    kl_penalty_needs_reference,
    on_policy_ratio_one_epoch,
    distillation_one_step,
    distillation_loss_keys,
    async_needs_is_correction,
    async_without_dynamic_sampling,
    async_without_vllm_sleep,
    async_one_generator,
    validation_metric_known,
    early_stop_needs_validation,
    positive_nll_not_in_recipes,
]


def broken_rules(cfg) -> list[str]:
    """Every line the rules find wrong with ``cfg``: the section rules' alone if they find any."""
    errors = [line for rule in SECTION_RULES for line in rule(cfg)]
    return errors or [line for rule in RULES for line in rule(cfg)]
