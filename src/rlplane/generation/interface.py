"""The generation backend interface shared by ``hf`` and ``vllm``: token ids in, token ids out.

Per prompt a backend returns the generated tokens (through the stop token), each token's logprob
under the distribution the sampler drew from (after temperature, top-k, top-p: vLLM's
``processed_logprobs``), and why the row stopped. The trainer's logprobs use the same processing
(``sampling.sampling_logprobs``), so ``train/token_mult_prob_error`` is 1 for equal weights.
"""

from __future__ import annotations

import abc
import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from rlplane.models.fingerprint import Fingerprint, fingerprint

FINISH_STOP = "stop"  # an eos / stop token id, or a stop string, ended the row
FINISH_LENGTH = "length"  # max_new_tokens reached first


@dataclass
class GenerationOutput:
    """One entry per prompt, in prompt order.

    output_ids: generated token ids only, through the stop token inclusive. ``len`` = T_i.
    logprobs: float32 tensors of shape (T_i,), processed log-probs of ``output_ids``.
    finish_reasons: ``"stop"`` or ``"length"``.
    versions: long tensors of shape (T_i,), the weight version each token was sampled with (the
        version given to ``update_weights``); None when the backend was never given one.
    """

    output_ids: list[list[int]]
    logprobs: list[torch.Tensor]
    finish_reasons: list[str]
    versions: list[torch.Tensor] | None = None


class WeightSwap:
    """Weight updates handed to a generation in flight.

    ``update(state_dict, version)`` loads at once when nothing generates. While a generation runs
    (:meth:`generating`), it hands the weights over and waits until the generating thread loads them
    at its next :meth:`boundary` (between two forwards, never inside one) or when the generation ends;
    the tensors are copied before ``update`` returns. ``version`` is the version loaded last (None
    until one is given), read at each boundary to stamp the next tokens.
    """

    def __init__(self, load: Callable[[Mapping[str, torch.Tensor]], None]):
        self._load = load
        self._cond = threading.Condition()
        self._generating = 0
        self._pending: tuple[Mapping[str, torch.Tensor], int | None] | None = None
        self._error: BaseException | None = None  # a handed-over load that failed, for its updater
        self.version: int | None = None

    def update(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        with self._cond:
            if not self._generating:
                self._apply(state_dict, version)
                return
            self._pending, self._error = (state_dict, version), None
            while self._pending is not None:
                self._cond.wait()
            if self._error is not None:
                raise RuntimeError(f"update_weights: loading in the generating thread failed: {self._error}") \
                    from self._error

    def boundary(self) -> int | None:
        """Load weights handed over since the last call (the generating thread, between forwards);
        returns the version the next forward runs with."""
        with self._cond:
            if self._pending is not None:
                self._apply(*self._pending)
            return self.version

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        with self._cond:
            self._generating += 1
        try:
            yield
        finally:
            with self._cond:
                self._generating -= 1
                if self._pending is not None and not self._generating:
                    self._apply(*self._pending)  # a swap handed over after the last boundary

    def _apply(self, state_dict: Mapping[str, torch.Tensor], version: int | None) -> None:
        """Under the lock: load, stamp, wake the updater (which re-raises a failed load)."""
        self._pending = None
        try:
            self._load(state_dict)
            if version is not None:
                self.version = int(version)
        except BaseException as e:
            self._error = e
            raise
        finally:
            self._cond.notify_all()


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

        ``top_k`` 0/None and ``top_p`` 1.0 switch those filters off; ``greedy`` takes the argmax (its
        logprob still under the processed distribution). ``stop_token_ids`` defaults to
        :func:`default_stop_token_ids`. Randomness: ``row_seeds`` where supported (one int64 per prompt,
        :func:`~rlplane.generation.sampling.sample_seed`; a row's tokens then do not depend on the batch),
        else ``generator``, else a generator seeded with ``seed``, else torch's global RNG.
        """

    @abc.abstractmethod
    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        """Refit: load new policy weights into the generator's model; ``version`` (the trainer's step)
        stamps the tokens sampled with them (:attr:`GenerationOutput.versions`). Safe to call while
        another thread generates (:class:`WeightSwap`): ``hf`` swaps at the next token, ``vllm`` once
        the request in flight ends."""

    def fingerprint(self, names: Sequence[str] | None = None) -> Fingerprint:
        """The fingerprint of the weights the engine holds now, under HF names (only ``names`` when given;
        :mod:`rlplane.models.fingerprint`): a refit's check compares it with the fingerprint of what was sent."""
        return fingerprint(self.model.state_dict(), names)

    def sleep(self) -> None:
        """Release the accelerator memory the backend holds while the policy trains on the same device
        (vLLM's sleep mode); the next ``generate`` or ``update_weights`` takes it back. Nothing by default."""


def default_stop_token_ids(model, tokenizer) -> list[int]:
    """The token ids that end a generation by default: the tokenizer's eos plus the model's
    ``generation_config.eos_token_id`` (an int or a list), in that order, without repeats.

    Chat models often end a turn with another token (Llama 3's ``<|eot_id|>``, Qwen's ``<|im_end|>``)
    listed in their generation config; transformers' ``generate`` and vLLM stop at them too.
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
