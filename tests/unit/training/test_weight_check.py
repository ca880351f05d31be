"""Verified weight sync on the tiny model in this process: two generators with their own weights (one
suffers each fault of ``weight_faults``), the policy's weights changed by hand between refits."""

from __future__ import annotations

import math

import pytest
import torch

from rlplane.config.loading import ConfigError, load_config
from rlplane.dataplane import make_data_plane
from rlplane.training.plan import build_plan
from rlplane.training.refit import Refit
from rlplane.training.weight_check import WeightCheckOptions, WeightSyncError
from rlplane.training.workers import Workers
from rlplane.workers.weight_sync import PROBE_TOLERANCE, probe_error, tolerance
from tests.unit.training.weight_faults import DETECTED_AFTER, KINDS, faulty_worker

BASE = ["warmup.enabled=false", "grpo.val_at_start=false", "policy.generation.num_generators=2"]


def test_probe_error_is_token_mult_prob_error():
    g, p = torch.tensor([-1.0, -2.0]), torch.tensor([-1.1, -2.0])
    assert math.isclose(probe_error(g, p), (math.exp(0.1) + 1.0) / 2, rel_tol=1e-6)
    assert probe_error(g, g) == 1.0 and probe_error(torch.zeros(0), torch.zeros(0)) == 1.0
    assert math.isnan(probe_error(torch.tensor([float("nan")]), torch.tensor([0.0])))
    assert tolerance("fp32", "bf16") == PROBE_TOLERANCE["bf16"] > tolerance("fp32") > 1.0


def test_verify_weights_reads_a_bare_yaml_off(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("policy:\n  generation: {verify_weights: off}\n")
    assert load_config(str(path), []).policy.generation.verify_weights == "off"
    assert load_config(None, []).policy.generation.verify_weights == "fail"
    with pytest.raises(ConfigError, match="verify_weights"):
        load_config(None, ["policy.generation.verify_weights=loud"])


class _Policy:
    """A policy group stand-in: ``weight_check`` answers with a fixed fingerprint and probe score."""

    def __init__(self, fp, score):
        self.fp, self.score = fp, score

    def lazy(self, method, probes, shared=False):
        return {"fingerprint": self.fp, "precision": "fp32", "probe_logprobs": [self.score] * len(probes)}

    def wait(self, handles):
        return handles


def test_a_rows_metrics_are_those_of_the_versions_it_used_and_a_nan_probe_fails():

    from rlplane.models.fingerprint import fingerprint
    from rlplane.training.weight_check import WeightCheck
    from rlplane.workers.weight_sync import GeneratorReport

    fp, said = fingerprint({"w": torch.ones(3)}), []
    check = WeightCheck(WeightCheckOptions("warn", 1), said.append)

    def reports(lp, previous):
        return lambda probe, with_fp: [GeneratorReport(3, fp, "fp32", ([1], [2], lp) if probe else None, previous)]

    check.run(reports(torch.tensor([-0.5]), None), _Policy(fp, torch.tensor([-0.5])), 3)
    assert set(check.take_metrics(2)) == {"timing/weight_sync/check"}  # version 3's row is not step 2's
    assert check.take_metrics(3) == {"weight_sync/probe_token_mult_prob_error": 1.0}
    check.run(reports(torch.tensor([float("nan")]), 3), _Policy(fp, torch.tensor([-0.5])), 3)
    assert said[-1].endswith("probe token_mult_prob_error nan > 1.001 (fp32 / fp32)")
    check.run(reports(torch.tensor([-0.5]), None), _Policy(fp, torch.tensor([-0.5])), 3)
    assert said[-1].endswith("it held version none before this refit, not the 3 verified last (restarted, or its "
                             "weights replaced)")
    assert check.take_metrics(3)["weight_sync/mismatches"] == 2.0


def changed(workers, step: int) -> None:
    """The policy's weights change as an optimizer step would change them (the adapters only, under LoRA)."""
    model = workers.policy.workers[0].model
    g = torch.Generator().manual_seed(step)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(1e-3 * torch.randn(p.shape, generator=g))


def refits(monkeypatch, tmp_path, schedule: dict[int, str], n: int, *extra: str) -> list[float]:
    """Mismatches found at each of refits 0..n-1 (warn mode), generator 1 suffering ``schedule``."""
    monkeypatch.setattr("rlplane.training.workers.RolloutWorker", faulty_worker(schedule))
    cfg = load_config(None, [*BASE, f"run_dir={tmp_path}", "policy.generation.verify_weights=warn", *extra])
    workers = Workers(build_plan(cfg), make_data_plane("memory"), cfg.env)
    said: list[str] = []
    try:
        workers.start(None)
        refit = Refit(workers, workers.plan.weight_check, say=said.append)
        found = []
        for step in range(n):
            if step:
                changed(workers, step)
                if step - 1 in {k for k, v in schedule.items() if v == "restart"}:
                    workers.rollout.group.workers[1].backend.generate([[1, 2]], max_new_tokens=1)  # a rollout
            refit.version = step
            refit.mark_stale()
            refit.if_stale()
            found.append(refit.take_metrics(step).get("weight_sync/mismatches", 0.0))
    finally:
        workers.close()
    assert all(line.startswith("weight sync: generator 1 of 2 holds ") for line in said)
    return found


@pytest.mark.parametrize("kind", [k for k in KINDS if not k.startswith("lora")])
def test_each_fault_is_found_at_its_refit_and_clean_refits_pass(monkeypatch, tmp_path, kind):
    found = refits(monkeypatch, tmp_path, {1: kind, 3: kind}, 5)
    at = DETECTED_AFTER.get(kind, 0)
    assert found == [1.0 if i in (1 + at, 3 + at) else 0.0 for i in range(5)]


@pytest.mark.parametrize("kind", ["lora_twice", "lora_none"])
def test_a_lora_update_merged_twice_or_not_at_all_is_found(monkeypatch, tmp_path, kind):
    found = refits(monkeypatch, tmp_path, {2: kind}, 4, "policy.lora.enabled=true")
    assert found == [0.0, 0.0, 1.0, 0.0]


def test_fail_mode_stops_with_one_line_naming_generator_versions_and_fingerprints(monkeypatch, tmp_path):
    monkeypatch.setattr("rlplane.training.workers.RolloutWorker", faulty_worker({1: "skip"}))
    cfg = load_config(None, [*BASE, f"run_dir={tmp_path}"])
    workers = Workers(build_plan(cfg), make_data_plane("memory"), cfg.env)
    try:
        workers.start(None)
        refit = Refit(workers, workers.plan.weight_check)
        refit.mark_stale()
        refit.if_stale()
        changed(workers, 1)
        refit.version = 1
        refit.mark_stale()
        with pytest.raises(WeightSyncError) as e:
            refit.if_stale()
    finally:
        workers.close()
    line = str(e.value)
    assert "\n" not in line
    assert line.startswith("weight sync: generator 1 of 2 holds version 0 (fingerprint ")
    assert "the trainer is at version 1 (fingerprint " in line and "the refit did not reach it" in line
    assert line.endswith("policy.generation.verify_weights=warn goes on regardless")


def test_a_generator_sharing_the_policy_module_passes_with_an_exact_probe(tmp_path):
    cfg = load_config(None, ["warmup.enabled=false", f"run_dir={tmp_path}"])
    workers = Workers(build_plan(cfg), make_data_plane("memory"), cfg.env)
    try:
        workers.start(None)
        assert workers.generator_shares_weights
        refit = Refit(workers, workers.plan.weight_check)
        refit.if_stale()
        metrics = refit.take_metrics(0)
    finally:
        workers.close()
    assert "weight_sync/mismatches" not in metrics
    assert metrics["weight_sync/probe_token_mult_prob_error"] < PROBE_TOLERANCE["fp32"]


def test_off_checks_nothing_and_the_probe_cadence_skips_probes(monkeypatch, tmp_path):
    assert refits(monkeypatch, tmp_path, {1: "skip"}, 2, "policy.generation.verify_weights=off") == [0.0, 0.0]
    monkeypatch.setattr("rlplane.training.workers.RolloutWorker", faulty_worker({}))
    cfg = load_config(None, [*BASE, f"run_dir={tmp_path}/b", "policy.generation.verify_probe_every=2"])
    workers = Workers(build_plan(cfg), make_data_plane("memory"), cfg.env)
    try:
        workers.start(None)
        refit = Refit(workers, workers.plan.weight_check)
        probed = []
        for step in range(3):
            refit.version = step
            refit.mark_stale()
            refit.if_stale()
            probed.append("weight_sync/probe_token_mult_prob_error" in refit.take_metrics(step))
    finally:
        workers.close()
    assert probed == [True, False, True]
