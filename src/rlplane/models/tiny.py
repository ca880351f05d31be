"""The embedded default: a character-level tokenizer and a tiny random-init Llama, both ordinary HF artifacts."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)  # ids 0..3, in this order
CHARS = tuple("0123456789") + ("+", "-", "*", "=", "(", ")", " ")


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """A 21-token character-level tokenizer (``<pad> <bos> <eos> <unk>``, digits, ``+-*=()``, space); ``<bos>``
    is prepended with ``add_special_tokens=True``."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        model_max_length=256,
        clean_up_tokenization_spaces=False,
    )


def build_tiny_llama(tokenizer: PreTrainedTokenizerFast, *, seed: int = 0, **shape) -> LlamaForCausalLM:
    """A random Llama with tied embeddings sized for ``tokenizer``, its ``shape`` as :func:`tiny_llama_config`
    takes it, deterministic in ``seed``; leaves the global RNG untouched."""
    config = tiny_llama_config(tokenizer, **shape)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def tiny_llama_config(
    tokenizer: PreTrainedTokenizerFast,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 256,
) -> LlamaConfig:
    """The architecture :func:`build_tiny_llama` builds (no weights); ``intermediate_size`` defaults to
    ``2 * hidden_size``."""
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        intermediate_size=intermediate_size or 2 * hidden_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
