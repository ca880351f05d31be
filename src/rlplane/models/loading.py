"""Resolve ``policy.model_name`` to a (model, tokenizer) pair.

Accepted names:
- ``"embedded:tiny-llama"``: the char-level tokenizer and tiny random Llama of ``tiny.py``, built
  in-process, deterministic in ``seed`` (no files, no network);
- a local Hugging Face model directory (``config.json`` + weights + tokenizer files);
- a hub id, only where the hub is reachable or the model is already in the local HF cache.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from rlplane.models.tiny import build_char_tokenizer, build_tiny_llama

EMBEDDED_PREFIX = "embedded:"
EMBEDDED_MODELS = ("tiny-llama",)


class ModelLoadError(ValueError):
    """A model name that cannot be resolved; the message is one line, meant for the user."""


def _hub_offline() -> bool:
    flags = (os.environ.get(k, "").lower() for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return any(f in ("1", "true", "yes") for f in flags)


def load_policy(
    model_name: str,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    model_kwargs: dict[str, Any] | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load ``model_name`` as ``(model, tokenizer)``; the model is in eval mode, on CPU, in ``dtype``.

    ``model_kwargs`` go to ``build_tiny_llama`` for embedded models (``hidden_size``,
    ``num_layers``, ...) and to ``from_pretrained`` otherwise. ``seed`` only affects embedded
    models (their random initialisation). Raises ``ModelLoadError`` with a one-line message.
    """
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
        raise ModelLoadError(
            f"model_name={model_name!r}: no such directory; pass an existing local Hugging Face model "
            f"directory or {EMBEDDED_PREFIX}tiny-llama"
        )
    # A hub id: the local HF cache first; the network only when the hub is not marked offline.
    return _from_pretrained(model_name, model_name, dtype, model_kwargs, local_only=_hub_offline())


def _from_pretrained(model_name, source, dtype, model_kwargs, *, local_only):
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, local_files_only=local_only, **model_kwargs)
    except (OSError, ValueError) as e:
        if source != model_name or os.path.isdir(source):
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ModelLoadError(f"model_name={model_name!r}: cannot load local model directory: {reason}") from None
        where = (
            "not in the local Hugging Face cache, and the hub is unreachable offline (HF_HUB_OFFLINE=1)"
            if local_only
            else "not a local directory, and the Hugging Face hub could not provide it"
        )
        raise ModelLoadError(
            f"model_name={model_name!r}: no such local directory; {where}; pass a local Hugging Face "
            f"model directory or {EMBEDDED_PREFIX}tiny-llama"
        ) from None
    if tokenizer.pad_token_id is None:  # batched generation and training need a pad id
        tokenizer.pad_token = tokenizer.eos_token
    return model.eval(), tokenizer
