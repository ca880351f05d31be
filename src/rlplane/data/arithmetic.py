"""Procedurally generated arithmetic, ``"12+34="`` -> ``"46"``: problem ``i`` depends only on ``(seed, i)``, and
a stable hash of its text puts it in exactly one split (``train`` or ``eval``)."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
from torch.utils.data import Dataset
from transformers import PreTrainedTokenizerBase

from rlplane.data.datum import DatumSpec, PromptFormat, make_prompt_datum
from rlplane.data.errors import DatasetError

TASK_NAME = "arithmetic"
OPERATORS = ("+", "-", "*")
DEFAULT_EVAL_SEED = 2**31 - 1  # any seed works (the hash split keeps eval disjoint); this one is just fixed
_HASH_BUCKETS = 10_000
_U64 = 2**64 - 1  # SeedSequence takes non-negative ints; negative seeds wrap
_ENUMERATE_LIMIT = 1_000_000  # problem spaces up to this size are listed exactly for eval sets


@dataclass(frozen=True)
class ArithmeticSpec:
    """What problems look like.

    operators: drawn uniformly (subset of ``+ - *``). operand_min, operand_max: inclusive range.
    num_digits: overrides the range to ``0 .. 10**d - 1``. nonnegative: ``-`` never goes negative.
    eval_fraction: share of problems (by text hash) held out.
    by_digits_share: the share of training operands drawn by digit count (the count first, uniformly over the
    counts the range holds, then the operand among those); the rest are uniform over the range. Held-out problems
    are always uniform, so accuracy means the same whichever share is chosen.
    pad_operands: each operand written with leading zeros to the width of the range's largest (``"07+42="``), so a
    digit's place is the same in every prompt; answers are never padded.
    """

    operators: tuple[str, ...] = ("+",)
    operand_min: int = 0
    operand_max: int = 99
    num_digits: int | None = None
    nonnegative: bool = True
    eval_fraction: float = 0.1
    by_digits_share: float = 0.0
    pad_operands: bool = False

    def __post_init__(self):
        bad = [op for op in self.operators if op not in OPERATORS]
        if not self.operators or bad:
            raise DatasetError(f"operators = {list(self.operators)}: each must be one of {list(OPERATORS)}")
        if self.num_digits is not None and self.num_digits < 1:
            raise DatasetError(f"num_digits = {self.num_digits}: must be >= 1 (or null to use operand_min/max)")
        lo, hi = self.operand_range
        if lo > hi or lo < 0:
            raise DatasetError(f"operand range [{lo}, {hi}]: need 0 <= operand_min <= operand_max")
        if not 0.0 < self.eval_fraction < 1.0:
            raise DatasetError(f"eval_fraction = {self.eval_fraction}: must be in (0, 1); 0.1 is usual")
        if not 0.0 <= self.by_digits_share <= 1.0:
            raise DatasetError(f"by_digits_share = {self.by_digits_share}: must be in [0, 1]; 0 draws operands "
                               "uniformly")

    @property
    def operand_range(self) -> tuple[int, int]:
        if self.num_digits is not None:
            return 0, 10**self.num_digits - 1
        return self.operand_min, self.operand_max

    def text(self, a: int, op: str, b: int) -> str:
        """The prompt of ``a op b``: ``"7+42="``, or ``"07+42="`` with ``pad_operands``."""
        if not self.pad_operands:
            return f"{a}{op}{b}="
        width = len(str(self.operand_range[1]))
        return f"{a:0{width}d}{op}{b:0{width}d}="


def is_heldout(problem: str, eval_fraction: float) -> bool:
    """Whether ``problem`` belongs to the eval split: a stable (cross-process) hash bucket of its text."""
    return zlib.crc32(problem.encode()) % _HASH_BUCKETS < eval_fraction * _HASH_BUCKETS


def solve(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def digit_bands(lo: int, hi: int) -> list[tuple[int, int]]:
    """``[lo, hi]`` cut where the digit count changes: ``(0, 99)`` -> ``[(0, 9), (10, 99)]``."""
    bands, start = [], lo
    while start <= hi:
        end = min(hi, 10 ** len(str(start)) - 1)
        bands.append((start, end))
        start = end + 1
    return bands


def _draw_operand(rng: np.random.Generator, lo: int, hi: int, bands: list[tuple[int, int]], share: float) -> int:
    if rng.random() < share:
        lo, hi = bands[int(rng.integers(len(bands)))]
    return int(rng.integers(lo, hi + 1))


def draw_problem(rng: np.random.Generator, spec: ArithmeticSpec, split: str = "train") -> tuple[str, str]:
    """One ``(problem, answer)`` from ``split`` (``"train"``, ``"eval"`` or ``"any"``), by rejection; operands as
    ``spec.by_digits_share`` says for training problems, uniform for the others (a share of 0 draws what it
    always drew, number for number)."""
    lo, hi = spec.operand_range
    share = spec.by_digits_share if split == "train" else 0.0
    bands = digit_bands(lo, hi) if share > 0 else []
    for _ in range(10_000):
        if share > 0:
            a, b = _draw_operand(rng, lo, hi, bands, share), _draw_operand(rng, lo, hi, bands, share)
        else:
            a, b = (int(x) for x in rng.integers(lo, hi + 1, size=2))
        op = spec.operators[int(rng.integers(len(spec.operators)))] if len(spec.operators) > 1 else spec.operators[0]
        if op == "-" and spec.nonnegative and a < b:
            a, b = b, a
        problem = spec.text(a, op, b)
        if split == "any" or is_heldout(problem, spec.eval_fraction) == (split == "eval"):
            return problem, str(solve(a, op, b))
    raise DatasetError(
        f"split {split!r}: no problem found in 10000 draws; widen the operand range or change eval_fraction"
    )


class ArithmeticDataset(Dataset):
    """``num_problems`` prompts as ``DatumSpec``, item ``i`` from ``(seed, i)``, tokenized on access."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        spec: ArithmeticSpec = ArithmeticSpec(),
        *,
        num_problems: int = 100_000,
        seed: int = 0,
        split: str = "train",
        max_prompt_length: int | None = None,
        task_name: str = TASK_NAME,
        prompt_format: PromptFormat = PromptFormat(),
    ):
        if split not in ("train", "eval"):
            raise DatasetError(f"split = {split!r}: must be 'train' or 'eval'")
        if num_problems < 1:
            raise DatasetError(f"num_problems = {num_problems}: must be >= 1")
        self.tokenizer, self.spec, self.num_problems, self.seed, self.split = tokenizer, spec, num_problems, seed, split
        self.max_prompt_length, self.task_name, self.prompt_format = max_prompt_length, task_name, prompt_format

    def __len__(self) -> int:
        return self.num_problems

    def problem(self, idx: int) -> tuple[str, str]:
        """The ``(problem, answer)`` strings of item ``idx``."""
        if not 0 <= idx < self.num_problems:
            raise IndexError(idx)
        return draw_problem(np.random.default_rng([self.seed & _U64, idx]), self.spec, self.split)

    def __getitem__(self, idx: int) -> DatumSpec:
        problem, answer = self.problem(idx)
        datum = make_prompt_datum(
            problem, answer, self.tokenizer, idx=idx, task_name=self.task_name, prompt_format=self.prompt_format
        )
        if self.max_prompt_length is not None and datum.length > self.max_prompt_length:
            raise DatasetError(
                f"arithmetic problem {idx} ({problem!r}) is {datum.length} tokens, over max_prompt_length = "
                f"{self.max_prompt_length}; raise the maximum or use fewer digits"
            )
        return datum


def build_eval_set(
    tokenizer: PreTrainedTokenizerBase,
    spec: ArithmeticSpec = ArithmeticSpec(),
    *,
    num_problems: int = 500,
    seed: int = DEFAULT_EVAL_SEED,
    task_name: str = TASK_NAME,
    prompt_format: PromptFormat = PromptFormat(),
) -> list[DatumSpec]:
    """``num_problems`` distinct held-out problems (``DatasetError`` if the held-out space is too small)."""
    rng = np.random.default_rng([seed & _U64, 1])
    lo, hi = spec.operand_range
    space = (hi - lo + 1) ** 2 * len(spec.operators)
    if space <= _ENUMERATE_LIMIT:
        # Small space: list every held-out problem, take a seeded sample without replacement.
        pool: dict[str, str] = {}
        for op in spec.operators:
            for a in range(lo, hi + 1):
                for b in range(lo, hi + 1):
                    x, y = (b, a) if op == "-" and spec.nonnegative and a < b else (a, b)
                    problem = spec.text(x, op, y)
                    if problem not in pool and is_heldout(problem, spec.eval_fraction):
                        pool[problem] = str(solve(x, op, y))
        if len(pool) < num_problems:
            raise DatasetError(
                f"build_eval_set: only {len(pool)} distinct held-out problems exist, {num_problems} asked "
                f"(operands {lo}..{hi}, eval_fraction {spec.eval_fraction}); "
                "ask for fewer, widen the range or raise eval_fraction"
            )
        problems = list(pool.items())
        chosen = [problems[i] for i in rng.permutation(len(problems))[:num_problems]]
    else:
        # Large space: rejection-sample distinct problems (collisions are rare).
        chosen, seen = [], set()
        while len(chosen) < num_problems:
            problem, answer = draw_problem(rng, spec, "eval")
            if problem not in seen:
                seen.add(problem)
                chosen.append((problem, answer))
    return [
        make_prompt_datum(problem, answer, tokenizer, idx=i, task_name=task_name, prompt_format=prompt_format)
        for i, (problem, answer) in enumerate(chosen)
    ]
