"""Models and tokenizers: the embedded tiny Llama and loading of Hugging Face model directories."""

from rlplane.models.loading import EMBEDDED_MODELS, ModelLoadError, load_policy
from rlplane.models.tiny import build_char_tokenizer, build_tiny_llama

__all__ = ["EMBEDDED_MODELS", "ModelLoadError", "build_char_tokenizer", "build_tiny_llama", "load_policy"]
