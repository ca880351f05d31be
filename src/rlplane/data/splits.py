"""Seeded row orders as Hugging Face ``datasets`` draws them, so a split here holds the rows NeMo RL's holds.

``datasets`` shuffles with ``numpy.random.default_rng(seed).permutation(n)``; ``train_test_split`` puts the first
``n_test`` of that permutation in the test split (``ceil(size * n)`` for a fraction, ``size`` for a count) and
the next ``n - n_test`` in the train split.
"""

from __future__ import annotations

import math

from rlplane.data.errors import DatasetError


def shuffled_indices(n: int, seed: int) -> list[int]:
    """``Dataset.shuffle(seed)``'s order of ``n`` rows (numpy imported here: config checks reach this module)."""
    import numpy as np

    return np.random.default_rng(seed).permutation(n).tolist()


def held_out_split(n: int, size: float, seed: int) -> tuple[list[int], list[int]]:
    """``(train rows, held-out rows)`` of ``Dataset.train_test_split(test_size=size, seed=seed)`` over ``n`` rows:
    ``size`` < 1 a fraction, >= 1 a count (a whole-number float read as the count, as NeMo RL does)."""
    n_test = math.ceil(size * n) if size < 1 else int(size)
    if not 0 < n_test < n:
        raise ValueError(f"a held-out split of {size} leaves {n - n_test} of {n} rows to train on")
    order = shuffled_indices(n, seed)
    return order[n_test:], order[:n_test]


def hold_out(rows: list, size: float, seed: int, key: str) -> tuple[list, list]:
    """``(training rows, held-out rows)``: :func:`held_out_split` of ``rows`` (``key`` names the setting)."""
    try:
        train, test = held_out_split(len(rows), size, seed)
    except ValueError as e:
        raise DatasetError(f"{key} = {size}: {e}; hold out fewer rows") from None
    return [rows[i] for i in train], [rows[i] for i in test]


def repeated(rows: list, times: int) -> list:
    """Every row ``times`` times over, the whole list after itself (``Dataset.repeat``)."""
    return rows * times
