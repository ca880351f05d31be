"""The ``policy`` section: the trained model, its optimizer, how batches are cut and how generators sample."""

from __future__ import annotations

import importlib.metadata
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

import rlplane.extras as extras
from rlplane.config.base import StrictModel
from rlplane.config.vllm import VllmConfig

# vllm.LLM arguments rlplane sets itself: its weights directory, the trainer's dtype, processed logprobs, no
# generation_config defaults (policy.generation.vllm_kwargs may not override them).
VLLM_FIXED = ("model", "tokenizer", "dtype", "logprobs_mode", "generation_config", "seed")


class ColocatedConfig(StrictModel):
    """Where the generators run under `runtime: ray` (NeMo RL `policy.generation.colocated.*`)."""

    enabled: bool = Field(
        True, description="`true`: the generators share the policy ranks' placement-group bundles and release their "
        "weights (sleep) while the policy trains, woken by the next refit; `false`: the generators get bundles of "
        "their own (split) and keep their weights between steps."
    )


class GenerationConfig(StrictModel):
    """How the rollout workers sample responses."""

    backend: Literal["hf", "vllm"] = Field(
        "hf",
        description="Generation backend: `hf` (transformers, KV-cached decode loop) or `vllm` (optional extra; "
        "its engine is refit after every optimizer step).",
    )
    hf_decode: Literal["auto", "hf", "fused", "graph"] = Field(
        "auto",
        description="The `hf` backend's forward: `auto` runs Llama-family models (llama, mistral, qwen2) and Gemma 3 "
        "through rlplane's fused decode forward (fast/fused_decode.py), on CUDA the Llama family's decode steps "
        "as CUDA graphs (fast/graph_decode.py), and others through their own; `hf` forces the model's own "
        "forward, `fused` the fused one without graphs, `graph` the static-shape step (captured on CUDA, run "
        "eagerly elsewhere).",
    )
    temperature: float = Field(1.0, gt=0, description="Sampling temperature; training logprobs use the same one.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass (1.0 = off).")
    top_k: int | None = Field(None, ge=0, description="Top-k sampling (null or 0 = off).")
    max_new_tokens: int = Field(8, ge=1, description="Maximum generated tokens per turn.")
    val_temperature: float | None = Field(
        None, gt=0, description="Validation samples at this temperature (NeMo RL's key; its files set the training "
        "one), its pass@k too; null: validation is greedy, pass@k samples with the training temperature."
    )
    val_top_p: float | None = Field(None, gt=0, le=1, description="With val_temperature: validation's nucleus mass "
                                                                  "(null: top_p).")
    val_top_k: int | None = Field(None, ge=0, description="With val_temperature: validation's top-k (null: top_k).")
    stop_strings: list[str] | None = Field(None, description="Extra strings that end a response.")
    stop_token_ids: list[int] | None = Field(
        None, description="Token ids that also end a response, besides the model's end-of-sequence ids (NeMo RL's "
        "key; e.g. [128009], Llama 3's <|eot_id|>); the id ends the response and is trained on like an eos."
    )
    num_generators: int = Field(
        1, ge=1, description="Rollout workers, each with its own engine; a step's prompt groups are spread across "
        "them (a group stays on one) and they generate concurrently under `runtime: ray`."
    )
    colocated: ColocatedConfig = Field(default_factory=ColocatedConfig, description="Colocated or split placement.")
    timeout_s: float | None = Field(
        1800.0, gt=0, description="Seconds one generate call (a turn of a rollout batch) may take before the run "
        "stops with an error (null = wait forever)."
    )
    vllm_cfg: VllmConfig = Field(default_factory=VllmConfig, description="The vLLM engine (backend: vllm only).")
    vllm_kwargs: dict = Field(
        default_factory=dict, description="Extra keyword arguments for the vLLM engine (`vllm.LLM`), as NeMo RL passes "
        "them (e.g. compilation_config); backend vllm only. The ones rlplane sets for the logprobs to match the "
        f"trainer's ({', '.join(VLLM_FIXED)}) cannot be given."
    )
    verify_weights: Literal["fail", "warn", "off"] = Field(
        "fail", description="After every change of the policy's weights each generator echoes the weight version and "
        "a fingerprint of the weights it holds and scores a fixed probe the trainer scores too (docs/weight_sync.md): "
        "`fail` stops the run at a mismatch with one line, `warn` says the line and goes on, `off` checks nothing."
    )
    # The probe is the check's costly part (two forwards); versions and fingerprints catch wrong tensors every refit.
    verify_probe_every: int = Field(
        10, ge=0, description="Run the weight-sync probe at the weight versions (steps) divisible by N (0 = never: "
        "version and fingerprint only)."
    )

    @field_validator("verify_weights", mode="before")
    @classmethod
    def _yaml_off(cls, v):
        return "off" if v is False else v  # YAML reads a bare `off` as false

    @field_validator("verify_probe_every", mode="before")
    @classmethod
    def _probe_off(cls, v):
        return 0 if v is False else v  # `off` / false: never probe; true names no N, so it stays an error

    @model_validator(mode="after")
    def _engine_kwargs(self) -> GenerationConfig:
        fixed = sorted(set(self.vllm_kwargs) & set(VLLM_FIXED))
        if fixed:
            raise ValueError(f"vllm_kwargs.{fixed[0]}: rlplane sets it so the engine's logprobs match the trainer's; "
                             "remove it")
        return self

    @model_validator(mode="after")
    def _check_backend(self) -> GenerationConfig:
        if self.backend == "vllm":
            if not extras.vllm_available():
                raise ValueError(f"backend = 'vllm': vllm is not installed in this Python; {extras.VLLM_INSTALL_HINT}")
        return self


class OptimizerConfig(StrictModel):
    """AdamW, as in NeMo RL's exemplar configs."""

    lr: float = Field(2e-4, gt=0, description="Peak learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="Decoupled weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="Adam betas, each in [0, 1).")
    eps: float = Field(1e-8, gt=0, description="Adam epsilon.")

    @model_validator(mode="after")
    def _betas_in_range(self) -> "OptimizerConfig":
        # torch checks this only at the first optimizer step, after the warm-up has run.
        bad = [f"betas[{i}] = {b:g}" for i, b in enumerate(self.betas) if not 0.0 <= b < 1.0]
        if bad:
            raise ValueError(f"betas = {list(self.betas)}: {', '.join(bad)} is outside "
                             "[0, 1); Adam's betas are decay rates, e.g. [0.9, 0.999]")
        return self


class SchedulerConfig(StrictModel):
    """Linear warm-up from `warmup_start_factor`·lr to lr over `warmup_steps` optimizer steps, then `decay`:
    constant, or linear / cosine down to `min_lr_factor`·lr over the next `decay_steps`, flat after."""

    warmup_steps: int = Field(0, ge=0, description="Optimizer steps of linear warm-up (0 = constant lr).")
    warmup_start_factor: float = Field(0.1, gt=0, le=1, description="Fraction of lr at the first step.")
    decay: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="After the warm-up: constant lr, or a linear or cosine fall to min_lr_factor·lr.")
    decay_steps: int | None = Field(None, ge=1, description="Optimizer steps of the fall (after the warm-up); "
                                                            "needed by linear and cosine.")
    min_lr_factor: float = Field(0.0, ge=0, le=1, description="Fraction of lr at the end of the fall and after.")

    @model_validator(mode="after")
    def _decay_has_a_length(self) -> "SchedulerConfig":
        if self.decay != "constant" and self.decay_steps is None:
            raise ValueError(f"decay = {self.decay} needs decay_steps (optimizer steps of the fall after the "
                             "warm-up), e.g. the run's step count minus warmup_steps")
        return self


class TinyModelConfig(StrictModel):
    """Shape of the embedded tiny Llama (`policy.model_name: embedded:tiny-llama`)."""

    hidden_size: int = Field(128, ge=8, description="Hidden width.")
    num_layers: int = Field(2, ge=1, description="Transformer layers.")
    num_heads: int = Field(4, ge=1, description="Attention heads (must divide hidden_size).")
    intermediate_size: int = Field(256, ge=8, description="MLP width.")

    @model_validator(mode="after")
    def _heads_divide(self) -> "TinyModelConfig":
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size = {self.hidden_size} is not divisible by num_heads = {self.num_heads}; "
                "pick num_heads that divides it (e.g. 4)"
            )
        return self


class LoRAConfig(StrictModel):
    """Low-rank adapters through `peft` (`policy.lora.*`): only the adapters train; generation uses the
    merged weights; checkpoints hold the adapter; `rlplane export` writes the merged model."""

    enabled: bool = Field(False, description="Train LoRA adapters instead of every weight.")
    rank: int = Field(8, ge=1, description="Adapter rank r.")
    alpha: float = Field(16.0, gt=0, description="Scale numerator: the update is (alpha / rank) · B·A.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1, description="Names of the linear layers that get adapters (Llama names by default).",
    )
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter input.")


class DTensorConfig(StrictModel):
    """FSDP2 (``torch.distributed.fsdp.fully_shard``) over the DP ranks (NeMo RL `policy.dtensor_cfg.*`)."""

    enabled: bool = Field(
        False, description="Shard parameters, gradients and optimizer state of the policy, reference and value "
        "models across the policy.dp_size ranks (`runtime: ray`); `false` = plain DP, every rank a full copy."
    )
    cpu_offload: bool = Field(
        False, description="FSDP2's CPU offload (`CPUOffloadPolicy`): each rank keeps its shards of the parameters, "
        "gradients and optimizer state in host memory, copied to the device for each forward and backward; the "
        "AdamW step runs on the host. Less device memory, more host traffic. Needs `enabled`."
    )


class TokenBudgetConfig(StrictModel):
    """Micro-batches cut by a token budget instead of a row count (``policy.dynamic_batching`` /
    ``policy.sequence_packing``, NeMo RL's keys; ``workers/packing.py`` plans them). The loss is unchanged:
    it stays normalised by the global batch's counts, so only the padding that is computed changes."""

    enabled: bool = Field(False, description="Cut micro-batches by tokens (see the section's description).")
    train_mb_tokens: int | None = Field(
        None, ge=1, description="Tokens per training micro-batch (padding included); null = "
        "max_total_sequence_length × train_micro_batch_size."
    )
    logprob_mb_tokens: int | None = Field(
        None, ge=1, description="Tokens per no-grad logprob micro-batch; null = max_total_sequence_length × "
        "logprob_batch_size."
    )


def transformers_packs() -> bool:
    """Whether this transformers builds a block-diagonal mask from restarting position_ids (packed rows):
    ``masking_utils.find_packed_sequence_indices``, new in 4.54. Read from the installed version, since
    importing transformers takes seconds and a config is checked before anything heavy is imported."""
    try:
        version = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return False
    release = re.match(r"(\d+)\.(\d+)", version)
    return release is not None and (int(release[1]), int(release[2])) >= (4, 54)


class SequencePackingConfig(TokenBudgetConfig):
    """``policy.sequence_packing``: a token budget plus the width of a packed row."""

    row_tokens: int | None = Field(
        None, ge=2, description="Width of a packed row (several sequences share it); null = the longest sequence "
        "of the batch, where attention costs no more than in a padded batch. Wider rows fit more short sequences "
        "but SDPA/eager attention on a CPU costs width² per row (NeMo RL packs one row of train_mb_tokens, for "
        "flash-attention on GPUs)."
    )


class PolicyConfig(StrictModel):
    """The trained model, its optimizer and how batches are cut."""

    model_name: str = Field(
        "embedded:tiny-llama",
        description="`embedded:tiny-llama`, `packaged:smollm2-135m-instruct`, `packaged:gemma3-270m`, a local HF "
        "directory, or a hub id (downloaded only with network and HF_HUB_OFFLINE=0).",
    )
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="`bf16`: forwards under bf16 autocast (weights and optimizer stay fp32); `auto`: bf16 where "
        "the GPU or CPU has native bf16 arithmetic (the GPU's bf16 support; the CPU's flags avx512_bf16, amx_bf16 or "
        "Arm bf16: never a timing) and the model is not tiny (hidden size >= 256), else fp32. A run records its "
        "choice in config.yaml; a resumed run keeps the recorded one.",
    )
    lora: LoRAConfig = Field(default_factory=LoRAConfig, description="LoRA adapters (peft).")
    attn_implementation: Literal["sdpa", "eager"] | None = Field(
        None, description="transformers' attention kernel for the policy's forwards (null: transformers' default, "
        "sdpa). `eager` (plain matmul + softmax) is faster on a CPU for short sequences, where SDPA's flash kernel "
        "costs more per batch x head than the T x T scores it saves (the default job: 16 tokens)."
    )
    shared_prefix_forward: bool = Field(
        False, description="Training forward runs each distinct prompt of a micro-batch once and its responses "
        "against the prompt's keys/values (GRPO's groups share a prompt): the same logprobs and gradients, fewer "
        "tokens computed. Single-turn samples without sequence packing, activation checkpointing or FSDP; the "
        "plain forward elsewhere (workers/shared_prefix.py)."
    )
    activation_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass (less memory, ~20% more compute)."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "cpu", description="Where the policy/value workers compute: `cpu`, `cuda`, or `auto` (CUDA when the worker "
        "sees a GPU). Models, batches and autocast follow it; NCCL between CUDA ranks, gloo on CPU."
    )
    dtensor_cfg: DTensorConfig = Field(
        default_factory=DTensorConfig, description="FSDP2 sharding of the trained models (NeMo RL's key)."
    )
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig, description="Shape of the embedded model.")
    dynamic_batching: TokenBudgetConfig = Field(
        default_factory=TokenBudgetConfig, description="Rows sorted by length and cut by token budget, each "
        "micro-batch padded only to its own longest sequence."
    )
    sequence_packing: SequencePackingConfig = Field(
        default_factory=SequencePackingConfig, description="Several sequences per row (position ids restart, attention "
        "stays within each), rows as wide as the longest sequence; no padding is computed but row tails."
    )
    train_global_batch_size: int = Field(256, ge=1, description="Samples per optimizer step (across all DP ranks).")
    train_micro_batch_size: int = Field(256, ge=1, description="Samples per forward/backward on one rank.")
    logprob_batch_size: int = Field(256, ge=1, description="Samples per no-grad logprob forward on one rank.")
    generation_batch_size: int | None = Field(
        None, ge=1, description="hf backend: prompts a generator runs at once, at most (NeMo RL's key; its KV cache "
        "holds rows × length); more go in passes, each row sampling the same tokens in any pass. null: all at once."
    )
    max_total_sequence_length: int = Field(32, ge=2, description="Prompt + response tokens, at most.")
    max_grad_norm: float | None = Field(1.0, description="Gradient-norm clip, > 0 (null = off).")
    dp_size: int = Field(1, ge=1, description="Data-parallel policy workers (`runtime: ray` for more than 1).")
    threads_per_worker: int | None = Field(
        None, ge=1, description="torch threads per worker (null: 1 for a model narrower than 256 hidden units, "
                                "else OMP_NUM_THREADS if set, else the cores the process may use)."
    )
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig, description="AdamW settings.")
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig, description="LR schedule.")
    generation: GenerationConfig = Field(default_factory=GenerationConfig, description="Sampling settings.")

    @model_validator(mode="after")
    def _grad_norm(self) -> PolicyConfig:
        check_grad_norm(self.max_grad_norm)
        return self


def check_grad_norm(value: float | None) -> None:
    """A clip norm <= 0 would scale gradients by a non-positive factor: refused (null turns clipping off)."""
    if value is not None and not value > 0:
        raise ValueError(f"max_grad_norm = {value} would flip or zero every gradient; set it above 0 (1.0 is usual) "
                         "or to null for no clipping")
