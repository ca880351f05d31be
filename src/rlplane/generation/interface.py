"""The generation backend interface shared by ``hf`` and ``vllm``: token ids in, token ids out.

Every backend returns, per prompt, the generated tokens only (through the eos / stop token,
inclusive), the log-probability of each generated token under the distribution the sampler drew
from (``log_softmax`` of ``logits / temperature`` after top-k / top-p masking: vLLM's
``logprobs_mode="processed_logprobs"``), and why the row stopped. Training-side logprobs are
computed under the same temperature, top-k and top-p (``sampling.sampling_logprobs``) so the two
are comparable (``train/token_mult_prob_error`` is 1 when the weights are the same).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

FINISH_STOP = "stop"  # an eos / stop token id, or a stop string, ended the row
FINISH_LENGTH = "length"  # max_new_tokens reached first


@dataclass
class GenerationOutput:
    """One entry per prompt, in prompt order.

    output_ids: generated token ids only, through the stop token inclusive. ``len`` = T_i.
    logprobs: float32 tensors of shape (T_i,), processed log-probs of ``output_ids``.
    finish_reasons: ``"stop"`` or ``"length"``.
    """

    output_ids: list[list[int]]
    logprobs: list[torch.Tensor]
    finish_reasons: list[str]


# A flat list of stop strings applies to every row; a list of per-row lists (None = none) to each row,
# as environments return them in ``EnvironmentReturn.next_stop_strings``.
StopStrings = Sequence[str] | Sequence[Sequence[str] | None] | None


class GenerationBackend(abc.ABC):
    """Interface of a generation backend. Stateless between calls apart from the weights."""

    # True when the backend samples from the very module it was given (hf), so a colocated trainer's
    # optimizer steps reach it without a refit; False when it holds its own copy (vllm).
    shares_weights: bool = False
    # True when ``row_seeds`` make a row's samples independent of its batch (hf); a backend without
    # it accepts them and falls back on ``generator``.
    supports_row_seeds: bool = False

    @abc.abstractmethod
    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int | None = None,
        greedy: bool = False,
        stop_token_ids: Sequence[int] | None = None,
        stop_strings: StopStrings = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        row_seeds: Sequence[int] | None = None,
    ) -> GenerationOutput:
        """Generate a continuation for each prompt (unpadded token id lists).

        ``top_k`` 0 or None and ``top_p`` 1.0 switch those filters off. ``greedy`` takes the
        argmax (its logprob is still reported under the processed distribution).
        ``stop_token_ids`` defaults to :func:`default_stop_token_ids` (the tokenizer's eos and every
        id in the model's ``generation_config.eos_token_id``); an explicit list replaces it.
        Randomness comes from ``row_seeds`` if given and the backend supports them (one int64 per
        prompt, :func:`~rlplane.generation.sampling.sample_seed`: the token at position ``p`` of the
        row's sequence is drawn with ``counter_uniforms(row_seeds[i], p)``, so a row's tokens do not
        depend on the rest of the batch), else from ``generator``, else a fresh generator seeded
        with ``seed``, else the global torch RNG. ``supports_row_seeds`` says which.
        """

    @abc.abstractmethod
    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Refit: load new policy weights into the generator's model."""

    def sleep(self) -> None:
        """Release the accelerator memory the backend holds while the policy trains on the same device
        (vLLM's sleep mode); the next ``generate`` or ``update_weights`` takes it back. Nothing by default."""


def default_stop_token_ids(model, tokenizer) -> list[int]:
    """The token ids that end a generation by default: the tokenizer's eos plus the model's
    ``generation_config.eos_token_id`` (an int or a list), in that order, without repeats.

    Chat models often end a turn with a token other than the tokenizer's eos (Llama 3 instruct's
    ``<|eot_id|>``, Qwen's ``<|im_end|>`` beside ``<|endoftext|>``) and list every such token in
    their generation config; stopping at the tokenizer's eos alone runs those rows to
    ``max_new_tokens``. transformers' ``generate`` (the generation config's list) and vLLM (the
    tokenizer's eos plus, with ``generation_config="auto"``, the config's list) stop at them too.
    """
    ids: list[int] = []
    for source in (
        getattr(tokenizer, "eos_token_id", None),
        getattr(getattr(model, "generation_config", None), "eos_token_id", None),
    ):
        for i in source if isinstance(source, (list, tuple)) else [source]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    return ids


def normalize_stop_strings(stop_strings: StopStrings, batch_size: int) -> list[tuple[str, ...]] | None:
    """Per-row tuples of stop strings, or None when no row has any."""
    if not stop_strings:
        return None
    if all(isinstance(s, str) for s in stop_strings):
        rows = [tuple(stop_strings)] * batch_size
    else:
        if len(stop_strings) != batch_size:
            raise ValueError(
                f"stop_strings has {len(stop_strings)} per-row entries for {batch_size} prompts; "
                "give one list (or None) per prompt, or a flat list for all"
            )
        rows = [tuple(s) if s else () for s in stop_strings]
    rows = [tuple(s for s in r if s) for r in rows]
    return rows if any(rows) else None
