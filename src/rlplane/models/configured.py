"""The models a run's ``policy`` section describes: the policy and the PPO critic on its trunk (section + seed only);
its tokenizer and architecture alone, for a driver that needs no weights."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch
from transformers import AutoModelForTokenClassification

from rlplane.models.loading import load_model_config, load_policy, load_tokenizer
from rlplane.models.precision import apply_precision

if TYPE_CHECKING:
    from rlplane.config.policy import PolicyConfig


def load_configured_policy(policy: PolicyConfig, seed: int, *, trainable: bool = False,
                           init_state: dict[str, torch.Tensor] | None = None):
    """``(model, tokenizer)`` for ``policy.model_name`` with its attention, precision and checkpointing settings;
    ``init_state`` (HF names) is loaded first, then, with ``trainable`` and ``policy.lora.enabled``, LoRA."""
    p = policy
    embedded = p.model_name.startswith("embedded:")
    model, tokenizer = load_policy(p.model_name, seed=seed, model_kwargs=p.tiny.model_dump() if embedded else None)
    if init_state is not None:
        model.load_state_dict(init_state)
    if p.attn_implementation is not None:
        model.set_attn_implementation(p.attn_implementation)
    # Loaded on the host; "auto" is decided for the GPU the process will compute on where it sees one
    # (a driver without a GPU that loads the model for its own use decides for its host).
    gpu = p.device != "cpu" and torch.cuda.is_available()
    apply_precision(model, p.precision, device=torch.device("cuda" if gpu else "cpu"))
    if trainable and p.lora.enabled:
        from rlplane.models.lora import apply_lora

        model = apply_lora(model, p.lora.rank, p.lora.alpha, p.lora.target_modules, p.lora.dropout)
    if p.activation_checkpointing:
        # Non-reentrant: works with inputs that do not require grad and with autocast.
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, tokenizer


def configured_tokenizer(policy: PolicyConfig):
    """The tokenizer of ``policy.model_name`` (:func:`load_configured_policy`'s), its weights left unread."""
    return load_tokenizer(policy.model_name)


def configured_architecture(policy: PolicyConfig):
    """The architecture (an HF config: hidden size, layers, vocabulary) :func:`load_configured_policy` builds."""
    embedded = policy.model_name.startswith("embedded:")
    return load_model_config(policy.model_name, policy.tiny.model_dump() if embedded else None)


def configured_weight_shapes(policy: PolicyConfig, tokenizer) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every weight :func:`load_configured_policy` holds (no LoRA), from a skeleton on the meta
    device: no memory, no random numbers drawn."""
    from transformers import AutoModelForCausalLM

    config = configured_architecture(policy)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:  # a pad token added (ensure_pad_token)
        model.resize_token_embeddings(len(tokenizer))
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def build_value_model(policy: PolicyConfig, seed: int, init_state: dict[str, torch.Tensor] | None = None):
    """``(value_model, tokenizer)``: ``AutoModelForTokenClassification`` (``num_labels = 1``) on the policy's
    trunk (``init_state``: a causal-LM state dict) with a zero head; leaves the global RNG untouched."""
    causal, tokenizer = load_configured_policy(policy, seed)
    if init_state is not None:
        causal.load_state_dict(init_state)
    config = copy.deepcopy(causal.config)
    config.num_labels = 1
    config.classifier_dropout = 0.0  # values must not depend on train/eval mode (old values vs training)
    config.architectures = None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForTokenClassification.from_config(config)
    trunk = getattr(model, model.base_model_prefix)
    trunk.load_state_dict(getattr(causal, causal.base_model_prefix).state_dict())
    head = model.score
    torch.nn.init.zeros_(head.weight)
    if head.bias is not None:
        torch.nn.init.zeros_(head.bias)
    return model.to(torch.float32), tokenizer
