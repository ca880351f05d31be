"""The soak benchmark's loop, CI-sized: ~200 async GRPO steps of the tiny policy, and the data plane's
index stays bounded (its slots and tombstones stop growing once the pipeline is full)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


@pytest.fixture(scope="module")
def soak():
    spec = importlib.util.spec_from_file_location("rlplane_soak", SOAK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_index_stays_bounded_over_200_async_steps(soak, tmp_path):
    rows = soak.run_soak(soak.soak_config(200, str(tmp_path / "run")), every=20)
    assert [r["step"] for r in rows] == [1, *range(20, 201, 20)]
    early = rows[:3]  # steps 1, 20, 40: the pipeline is full by then
    bound = max(r["slots"] for r in early)
    for r in rows:
        assert r["slots"] <= bound and r["live_keys"] + r["tombstones"] <= r["slots"], r
        assert r["chunks"] <= max(x["chunks"] for x in early), r
    figures = soak.verdict(rows)
    index = {k: figures[k] for k in soak.INDEX}  # (first, midpoint, last, flat)
    assert all(f[3] for f in index.values()), index
    assert rows[-1]["driver_fds"] <= rows[1]["driver_fds"] + 4
