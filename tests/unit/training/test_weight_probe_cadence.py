"""``policy.generation.verify_probe_every``: the weight-sync probe runs at exactly the versions divisible by N
(never with 0), whatever the order of the versions checked; values the schema refuses say so in one line."""

from __future__ import annotations

import json
import random

import pytest
import torch

from rlplane.config.loading import ConfigError, load_config
from rlplane.models.fingerprint import fingerprint
from rlplane.recipes.grpo import train
from rlplane.training.weight_check import WeightCheck, WeightCheckOptions
from rlplane.workers.weight_sync import GeneratorReport
from tests.unit.training.weight_faults import SMALL

FP = fingerprint({"w": torch.ones(3)})


class _Policy:
    """A policy group stand-in: the fingerprint sent and an exact score of every probe."""

    def lazy(self, method, probes, shared=False):
        return {"fingerprint": None if shared else FP, "precision": "fp32",
                "probe_logprobs": [torch.tensor([-0.5])] * len(probes)}

    def wait(self, handles):
        return handles


def probed_versions(every: int, versions: list[int], shared: bool = False, allowed=lambda v: True) -> list[int]:
    """The versions at which ``WeightCheck`` asked the generators for a probe (a report without one: not listed)."""
    check = WeightCheck(WeightCheckOptions("fail", every), say=print)
    asked, held = [], None

    def reports(probe, with_fp):
        asked.append((version, probe))
        return [GeneratorReport(version, FP if with_fp else None, "fp32",
                                ([1], [2], torch.tensor([-0.5])) if probe else None, held)]

    for version in versions:
        check.run(reports, _Policy(), version, shared=shared, probe=allowed(version))
        held = version
    return [v for v, probe in asked if probe]


@pytest.mark.parametrize("every", [0, 1, 2, 3, 5, 7, 10, 64])
@pytest.mark.parametrize("shared", [False, True])
def test_the_probe_runs_exactly_at_the_versions_divisible_by_n(every, shared):
    rng = random.Random(every)
    runs = [list(range(41)),  # every step
            sorted(rng.sample(range(200), 30)),  # steps with gaps (a resume, a version checked twice skipped)
            [0, 1, 2, 2, 3, 10, 10, 20]]  # a version checked again (a checkpoint load at the same step)
    for versions in runs:
        want = [v for v in versions if every and v % every == 0]
        assert probed_versions(every, versions, shared) == want


@pytest.mark.parametrize("every", [1, 2, 3])
def test_no_probe_where_none_can_run_and_only_the_due_versions_otherwise(every):
    versions = list(range(13))
    busy = {3, 4, 6, 9}  # a generation in flight (async in-flight weight updates)
    got = probed_versions(every, versions, allowed=lambda v: v not in busy)
    assert got == [v for v in versions if v % every == 0 and v not in busy]


def test_a_shared_generator_reports_only_when_probed():
    calls = []
    check = WeightCheck(WeightCheckOptions("fail", 4), say=print)
    for v in range(9):
        check.run(lambda probe, fp: calls.append((v, probe, fp)) or [GeneratorReport(None, None, "fp32",
                  ([1], [2], torch.tensor([-0.5])))], _Policy(), v, shared=True)
    assert calls == [(0, True, False), (4, True, False), (8, True, False)]


@pytest.mark.parametrize(("value", "expected"), [("0", 0), ("1", 1), ("10", 10), ("off", 0), ("false", 0)])
def test_the_schema_reads(value, expected):
    assert load_config(None, [f"policy.generation.verify_probe_every={value}"]).policy.generation.verify_probe_every \
        == expected


@pytest.mark.parametrize("value", ["-1", "null", "1.5", "often"])
def test_invalid_values_are_refused_in_one_line(value):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"policy.generation.verify_probe_every={value}"])
    assert "\n" not in str(e.value) and str(e.value).startswith("policy.generation.verify_probe_every: ")


@pytest.mark.parametrize("every", [0, 3])
def test_a_run_logs_the_probe_at_the_steps_it_is_due(tmp_path, every):
    cfg = load_config(None, [*SMALL, f"run_dir={tmp_path}", "grpo.max_num_steps=7",
                             f"policy.generation.verify_probe_every={every}"])
    train(cfg, quiet=True)
    rows = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    # Step n's refit (version n) is logged with row n + 1.
    probed = [r["step"] - 1 for r in rows if "weight_sync/probe_token_mult_prob_error" in r]
    assert probed == [v for v in range(7) if every and v % every == 0]
    assert all(not r.get("weight_sync/mismatches") for r in rows)
