"""Generation backends: token ids in, generated ids + processed logprobs + finish reasons out."""

from rlplane.generation.hf import HFGenerationBackend
from rlplane.generation.interface import (
    FINISH_LENGTH,
    FINISH_STOP,
    GenerationBackend,
    GenerationOutput,
    default_stop_token_ids,
    normalize_stop_strings,
)
from rlplane.generation.sampling import apply_top_k, apply_top_p, process_logits, sample, sampling_logprobs


def create_backend(backend: str, model, tokenizer, **options) -> GenerationBackend:
    """The backend ``policy.generation.backend`` names: ``hf`` samples from ``model`` itself; ``vllm`` (lazily
    imported) builds an engine from its weights and needs ``update_weights`` after each optimizer step."""
    if backend == "hf":
        return HFGenerationBackend(model, tokenizer, **options)
    if backend == "vllm":
        from rlplane.generation.vllm_backend import VLLMGenerationBackend

        return VLLMGenerationBackend(model, tokenizer, **options)
    raise ValueError(f"policy.generation.backend = {backend!r}: unknown backend; use hf or vllm")

__all__ = [
    "FINISH_LENGTH",
    "FINISH_STOP",
    "GenerationBackend",
    "GenerationOutput",
    "HFGenerationBackend",
    "apply_top_k",
    "create_backend",
    "default_stop_token_ids",
    "apply_top_p",
    "normalize_stop_strings",
    "process_logits",
    "sample",
    "sampling_logprobs",
]
