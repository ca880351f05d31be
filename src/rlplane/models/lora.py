"""LoRA through ``peft``, as a model-loading concern: the trainer's code is the same with or without it.

Refit: :func:`policy_weights` gives merged weights ``W + (alpha / r)·B·A`` under the base names without
touching the trained module (in-place merge/unmerge would drift the fp32 base). Checkpoints hold the
adapter only; :func:`load_policy_weights` reads either kind. Colocated ``hf`` generation samples through the
unmerged adapters.
"""

from __future__ import annotations

import os

import torch

INSTALL_HINT = "pip install 'rlplane[lora]' (or pip install peft)"
ADAPTER_CONFIG = "adapter_config.json"


def _peft():
    try:
        import peft
    except ImportError:
        raise ImportError(f"policy.lora.enabled needs peft, which is not installed; {INSTALL_HINT}") from None
    return peft


def is_lora(model: torch.nn.Module) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def apply_lora(model: torch.nn.Module, rank: int, alpha: float, target_modules: list[str], dropout: float):
    """``model`` wrapped with fresh LoRA adapters (B = 0: same outputs); rlplane's attributes stay visible."""
    peft = _peft()
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    unknown = [t for t in target_modules if t not in names]
    if unknown:
        raise ValueError(
            f"policy.lora.target_modules: {unknown} name no linear layer of this model; its linear layers are "
            f"{sorted(names)}"
        )
    config = peft.LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=list(target_modules), lora_dropout=dropout, bias="none",
        task_type="CAUSAL_LM",
    )
    return peft.get_peft_model(model, config)


@torch.no_grad()
def policy_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights a generator loads (fresh tensors): for a LoRA model the merged weights under the
    base model's names; otherwise the model's own state dict."""
    if not is_lora(model):
        return {k: v.detach().clone() for k, v in model.state_dict().items()}
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas = {
        name: module.get_delta_weight(module.active_adapters[0])
        for name, module in base.named_modules()
        if isinstance(module, LoraLayer) and hasattr(module, "base_layer")
    }
    out = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        name = key.replace(".base_layer.", ".")
        module_name, leaf = name.rsplit(".", 1)
        value = value.detach().clone()
        if leaf == "weight" and module_name in deltas:
            value += deltas[module_name].to(value.dtype)
        out[name] = value
    return out


def load_policy_weights(model: torch.nn.Module, weights_dir: str) -> None:
    """Load a checkpoint's ``policy/weights`` into ``model``: an adapter into a LoRA model, else full weights."""
    from safetensors.torch import load_file

    if is_lora(model):
        path = os.path.join(weights_dir, "adapter_model.safetensors")
        if not os.path.isfile(path):
            raise ValueError(f"checkpoint {weights_dir} holds no adapter (adapter_model.safetensors); it was not "
                             "written with policy.lora.enabled")
        result = _peft().set_peft_model_state_dict(model, load_file(path))
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise ValueError(f"checkpoint {weights_dir}: adapter keys this model lacks: {unexpected[:5]}")
        return
    weights = load_file(os.path.join(weights_dir, "model.safetensors"))
    missing, _ = model.load_state_dict(weights, strict=False)
    if not all("lm_head" in k for k in missing):
        raise ValueError(f"checkpoint {weights_dir} lacks weights: {missing[:5]}")
