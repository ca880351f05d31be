"""Generation backends: token ids in, generated ids + processed logprobs + finish reasons out."""

from rlplane.generation.hf import HFGenerationBackend
from rlplane.generation.interface import (
    FINISH_LENGTH,
    FINISH_STOP,
    GenerationBackend,
    GenerationOutput,
    normalize_stop_strings,
)
from rlplane.generation.sampling import apply_top_k, apply_top_p, process_logits, sample


def create_backend(backend: str, model, tokenizer) -> GenerationBackend:
    """The generation backend named by ``policy.generation.backend``, around ``model``/``tokenizer``."""
    if backend == "hf":
        return HFGenerationBackend(model, tokenizer)
    raise ValueError(f"policy.generation.backend = {backend!r}: unknown backend; use hf")

__all__ = [
    "FINISH_LENGTH",
    "FINISH_STOP",
    "GenerationBackend",
    "GenerationOutput",
    "HFGenerationBackend",
    "apply_top_k",
    "create_backend",
    "apply_top_p",
    "normalize_stop_strings",
    "process_logits",
    "sample",
]
