"""The generation backend interface shared by ``hf`` and ``vllm``: token ids in, token ids out.

Per prompt: generated tokens (through the stop token), their logprobs under the processed sampling
distribution (vLLM's ``processed_logprobs``; the trainer uses the same processing) and a finish reason.
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

    output_ids: generated ids through the stop token (T_i). logprobs: (T_i,) float32 processed logprobs.
    finish_reasons: ``"stop"`` or ``"length"``. versions: (T_i,) long weight version per token, or None.
    """

    output_ids: list[list[int]]
    logprobs: list[torch.Tensor]
    finish_reasons: list[str]
    versions: list[torch.Tensor] | None = None


class WeightSwap:
    """Weight updates handed to a generation in flight.

    ``update`` loads at once when idle; during a generation it waits until the generating thread loads them
    at its next :meth:`boundary` (between forwards) or the end. ``version``: the last loaded (None until one).
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
        """Load weights handed over since the last call; returns the version the next forward runs with."""
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


# A flat list of stop strings applies to every row; a list of per-row lists (None = none) to each row.
StopStrings = Sequence[str] | Sequence[Sequence[str] | None] | None


class GenerationBackend(abc.ABC):
    """Interface of a generation backend. Stateless between calls apart from the weights."""

    # True when the backend samples from the module it was given (hf): no refit for a colocated trainer.
    shares_weights: bool = False
    # True when ``row_seeds`` make a row's samples independent of its batch (hf); else ``generator`` is used.
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

        ``top_k`` 0/None and ``top_p`` 1.0 are off; ``greedy`` takes the argmax. Randomness: ``row_seeds``
        where supported (one int64 per prompt), else ``generator``, else ``seed``, else torch's global RNG.
        """

    @abc.abstractmethod
    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        """Refit: load new policy weights; ``version`` stamps the tokens they sample. Thread-safe: ``hf`` swaps at
        the next token, ``vllm`` once the request in flight ends."""

    def fingerprint(self, names: Sequence[str] | None = None) -> Fingerprint:
        """The fingerprint of the weights the engine holds now, under HF names (only ``names`` when given;
        :mod:`rlplane.models.fingerprint`): a refit's check compares it with the fingerprint of what was sent."""
        return fingerprint(self.model.state_dict(), names)

    def sleep(self) -> None:
        """Release accelerator memory while the policy trains (vLLM's sleep mode); nothing by default."""


def default_stop_token_ids(model, tokenizer) -> list[int]:
    """The tokenizer's eos plus the model's ``generation_config.eos_token_id`` entries, in order, no repeats
    (chat models end turns with e.g. ``<|eot_id|>``)."""
    ids: list[int] = []
    for source in (
        getattr(tokenizer, "eos_token_id", None),
        getattr(getattr(model, "generation_config", None), "eos_token_id", None),
    ):
        for i in source if isinstance(source, (list, tuple)) else [source]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    return ids


def stop_ids(backend: GenerationBackend, extra: Sequence[int]) -> list[int]:
    """The ids that end a response: ``backend``'s end-of-sequence ids, then ``extra`` (``policy.generation.
    stop_token_ids``, NeMo RL's key), no repeats."""
    return list(dict.fromkeys([*getattr(backend, "stop_token_ids", []), *map(int, extra)]))


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
