"""The tables of :mod:`rlplane.config.nemo`: NeMo RL's features rlplane does not have (refused when on,
noted when off) and the settings that change nothing rlplane computes (dropped, listed in one note)."""

from __future__ import annotations

from typing import Any, Callable


def is_off(value: Any) -> bool:
    """What "off" looks like in NeMo RL's YAML: null, false, 0, empty, an `enabled: false` section, "none"."""
    if isinstance(value, dict):
        return not value.get("enabled", False) if "enabled" in value else all(is_off(v) for v in value.values())
    return value in (None, False, 0, "", [], "none", "None")


def is_one(value: Any) -> bool:
    return value in (None, 1)


# (dotted key, when it counts as off, what it is in NeMo RL, what to do in rlplane): dropped with a note
# when off, refused when on.
FEATURES: list[tuple[str, Callable[[Any], bool], str, str]] = [
    ("policy.megatron_cfg", is_off, "Megatron-Core training",
     "rlplane trains transformers models: set policy.megatron_cfg.enabled=false policy.dtensor_cfg.enabled=true "
     "(NeMo RL's DTensor worker, read as rlplane's FSDP2)"),
    ("policy.dtensor_cfg.custom_parallel_plan", is_off, "custom parallel plan", "policy.dtensor_cfg (FSDP2)"),
    ("policy.dtensor_cfg.automodel_kwargs", is_off, "NeMo Automodel arguments", "a local HF model directory"),
    ("policy.draft", is_off, "draft (Eagle) model", "no draft model: remove the section"),
    ("policy.hf_config_overrides", is_off, "HF config overrides", "edit the model directory's config.json"),
    ("policy.offload_optimizer_for_logprob", is_off, "optimizer offload", "policy.dtensor_cfg.enabled=true"),
    ("policy.tokenizer.chat_template_kwargs", is_off, "chat-template arguments", "data.prompt.chat_template"),
    ("policy.tokenizer.chat_template", is_off, "custom chat template", "data.prompt.template"),
    ("policy.generation.refit_transport", is_off, "refit transport choice", "rlplane picks the refit path itself"),
    ("policy.generation.vllm_cfg.pipeline_parallel_size", is_one, "vLLM pipeline parallelism",
     "policy.generation.vllm_cfg.tensor_parallel_size"),
    ("policy.generation.vllm_cfg.expert_parallel_size", is_one, "vLLM expert parallelism",
     "policy.generation.vllm_cfg.tensor_parallel_size"),
    ("policy.generation.vllm_cfg.use_deep_gemm", is_off, "DeepGEMM kernels", "vLLM's default kernels"),
    ("policy.generation.vllm_cfg.num_last_layers_in_bf16", is_off, "mixed-precision layers", "policy.precision"),
    ("policy.generation.vllm_cfg.num_first_layers_in_bf16", is_off, "mixed-precision layers", "policy.precision"),
    ("grpo.val_start_at", lambda v: v is None or v <= 0, "delayed first validation",
     "validation every grpo.val_period steps from the start (grpo.val_at_start=false skips step 0)"),
    ("grpo.async_grpo.recompute_kv_cache_after_weight_updates", is_off, "KV-cache recompute after a refit",
     "grpo.async_grpo.in_flight_weight_updates=false (a refit waits for the generation in flight)"),
    ("ppo.async_ppo", is_off, "asynchronous PPO", "grpo.async_grpo (asynchronous GRPO) or synchronous PPO"),
    ("on_policy_distillation", is_off, "multi-teacher on-policy distillation",
     "algorithm: distillation (one teacher, teacher.model_name)"),
    ("reward_penalties", is_off, "NeMo-Gym reward penalties", "an environment's reward"),
    ("data.use_multiple_dataloader", is_off, "multiple dataloaders", "one data source (data.dataset)"),
    ("checkpointing.checkpoint_must_save_by", is_off, "save-by deadline", "checkpointing.save_period"),
    ("logger.swanlab_enabled", is_off, "SwanLab logging", "logger.wandb_enabled or logger.mlflow_enabled"),
    ("data_plane.observability", is_off, "data-plane metrics", "rlplane's timing/train/* metrics"),
]
# Settings with no effect on what rlplane computes (ports, monitors, kernels, file formats): dropped, one note.
NO_EFFECT = (
    "policy.dtensor_cfg._v2", "policy.logprob_chunk_size",
    "policy.make_sequence_length_divisible_by", "policy.tokenizer.use_fastokens",
    "policy.dynamic_batching.sequence_length_round", "policy.sequence_packing.algorithm",
    "policy.sequence_packing.microbatch_order", "policy.sequence_packing.sequence_length_round",
    "policy.generation.port_range_low", "policy.generation.port_range_high", "policy.generation.refit_cfg",
    "policy.generation.real_quant_export_cpu_offload", "policy.generation.mcore_generation_config",
    "policy.generation.colocated.resources", "policy.generation.vllm_cfg.async_engine",
    "policy.generation.vllm_cfg.precision", "policy.generation.vllm_cfg.logprobs_mode",
    "policy.generation.vllm_cfg.max_model_len", "policy.generation.vllm_cfg.use_tqdm",
    "policy.generation.vllm_cfg.distributed_executor_backend",
    "policy.generation.vllm_cfg.enable_vllm_metrics_logger", "policy.generation.vllm_cfg.vllm_metrics_logger_interval",
    "policy.generation.vllm_cfg.http_refit_api_key_env_var", "policy.generation.vllm_cfg.http_refit_server_port",
    "policy.generation.vllm_cfg.zmq_refit_server_port", "policy.generation.vllm_cfg.reset_encoder_cache_after_weight_"
    "update", "grpo.calculate_advantages_on_gpu", "ppo.calculate_advantages_on_gpu", "grpo.deduplicate_multimodal_data",
    "grpo.debug_payload_metrics", "checkpointing.model_save_format", "checkpointing.save_consolidated",
    "checkpointing.save_optimizer", "checkpointing.ft_save_period", "checkpointing.ft_keep_latest_k",
    "logger.monitor_gpus", "logger.gpu_monitoring", "logger.swanlab", "logger.tensorboard",
    "logger.wandb.log_nemo_gym_full_result_tables", "cluster.master_port_range_low", "cluster.master_port_range_high",
    "cluster.segment_size", "data.max_input_seq_length", "data.num_workers",
    "data_plane.impl", "data_plane.storage_capacity", "data_plane.num_storage_units",
    "data_plane.claim_meta_poll_interval_s", "data_plane.global_segment_size", "data_plane.local_buffer_size",
    "data_plane.controller_address", "data_plane.ack_timeout_ms",
)
PRECISION = {"bfloat16": "bf16", "float32": "fp32", "bf16": "bf16", "fp32": "fp32", "auto": "auto"}
GENERATION_BACKENDS = ("hf", "vllm")
