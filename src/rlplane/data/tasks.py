"""Per-task data processing (NeMo RL's ``TaskDataSpec``, ``AllTaskProcessedDataset``): each row's
``task_name`` picks its processor and prompt. An over-long prompt is kept with ``loss_multiplier = 0`` and
its messages cut short (``zero_loss``, NeMo RL's: generated and scored, never trained on), dropped and
counted (``skip``), or an error."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping

from torch.utils.data import Dataset
from transformers import PreTrainedTokenizerBase

from rlplane.data.datum import DatumSpec
from rlplane.data.errors import DatasetError
from rlplane.data.processors import DataProcessor, prompt_data_processor
from rlplane.data.task_spec import TaskDataSpec

OVERLONG_POLICIES = ("zero_loss", "skip", "error")
# NeMo RL cuts each message of an over-long prompt to this many tokens at most (the sample still runs).
ZERO_LOSS_MESSAGE_TOKENS = 4


def zero_loss_datum(datum: DatumSpec, max_seq_length: int) -> DatumSpec:
    """``datum`` kept out of the loss (NeMo RL): each message cut to at most
    ``min(4, max_seq_length // messages)`` tokens, ``loss_multiplier = 0``."""
    keep = max(1, min(ZERO_LOSS_MESSAGE_TOKENS, max_seq_length // max(1, len(datum.message_log))))
    log = [{**m, "token_ids": list(m["token_ids"][:keep])} for m in datum.message_log]
    return dataclasses.replace(datum, message_log=log, length=sum(len(m["token_ids"]) for m in log),
                               loss_multiplier=0.0)


class AllTaskProcessedDataset(Dataset):
    """Rows processed up front into :class:`DatumSpec` records by their task's processor.

    ``task_data_processors``: one processor for all rows, or ``{task_name: (TaskDataSpec, processor)}`` (a
    ``defaultdict`` supplies its own fallback, else the default spec with :func:`prompt_data_processor`).
    ``idx`` counts kept rows; ``num_skipped_overlong`` / ``num_zero_loss_overlong`` count over-long prompts."""

    def __init__(
        self,
        dataset: Iterable[Mapping],
        tokenizer: PreTrainedTokenizerBase,
        default_task_data_spec: TaskDataSpec,
        task_data_processors: DataProcessor | Mapping[str, tuple[TaskDataSpec, DataProcessor]] | None = None,
        *,
        max_seq_length: int | None = None,
        on_overlong: str = "zero_loss",
        source: str = "dataset",
    ):
        if on_overlong not in OVERLONG_POLICIES:
            raise DatasetError(f"on_overlong = {on_overlong!r}: must be one of {', '.join(OVERLONG_POLICIES)}")
        self.default_task_data_spec = default_task_data_spec
        self._pick = _dispatcher(default_task_data_spec, task_data_processors)
        self.datums: list[DatumSpec] = []
        self.num_skipped_overlong = self.num_zero_loss_overlong = 0
        rows = 0
        for row in dataset:
            rows += 1
            datum = self._process(dict(row), tokenizer, max_seq_length)
            if max_seq_length is not None and datum.length > max_seq_length:
                if on_overlong == "error":
                    where = f"{source}, line {row['line']}" if "line" in row else source
                    raise DatasetError(
                        f"{where}: prompt is {datum.length} tokens, over max_prompt_length = {max_seq_length}; "
                        "shorten it, raise the maximum, or keep such prompts (on_overlong: zero_loss or skip)"
                    )
                if on_overlong == "skip":
                    self.num_skipped_overlong += 1
                    continue
                self.num_zero_loss_overlong += 1
                datum = zero_loss_datum(datum, max_seq_length)
            self.datums.append(datum)
        if len(self.datums) == self.num_zero_loss_overlong:  # none left, or only zero-loss ones: nothing trains
            raise DatasetError(
                f"{source}: no prompts left ({self.num_skipped_overlong + self.num_zero_loss_overlong} of {rows} "
                f"longer than max_prompt_length = {max_seq_length}); raise the maximum"
            )

    def _process(self, row: dict, tokenizer, max_seq_length: int | None) -> DatumSpec:
        spec, fn = self._pick(row.get("task_name"))
        datum = fn(row, spec, tokenizer, max_seq_length, len(self.datums))
        if not isinstance(datum, DatumSpec):
            raise DatasetError(f"task {spec.task_name!r}: processor {getattr(fn, '__name__', fn)!r} returned "
                               f"{type(datum).__name__}, not a DatumSpec")
        return datum

    def __len__(self) -> int:
        return len(self.datums)

    def __getitem__(self, idx: int) -> DatumSpec:
        return self.datums[idx]


def _dispatcher(default: TaskDataSpec, processors) -> Callable[[str | None], tuple[TaskDataSpec, DataProcessor]]:
    """task name -> (spec, processor), NeMo RL's dispatch by ``task_name``."""
    if processors is None or callable(processors):
        fn = processors or prompt_data_processor
        return lambda _task: (default, fn)

    def pick(task):
        try:
            return processors[task]
        except KeyError:
            return default, prompt_data_processor

    return pick
