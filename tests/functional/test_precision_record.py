"""policy.precision: auto is settled once per run: config.yaml and checkpoints record the concrete choice, and a
resumed run keeps the recorded one even where this host would choose otherwise."""

from __future__ import annotations

import re

import yaml

from rlplane.cli import main
from rlplane.models import precision as prec
from tests.tiny import TINY_RUN

# Wide enough (hidden 256) for auto to follow the CPU's flags; otherwise as small as a run gets.
RUN = [*TINY_RUN, "grpo.val_at_end=false", "policy.tiny.hidden_size=256", "policy.tiny.intermediate_size=256"]


def _recorded(path) -> str:
    return yaml.safe_load(path.read_text())["policy"]["precision"]


def test_auto_is_recorded_and_a_resume_keeps_it_on_a_host_that_would_choose_otherwise(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(prec, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    assert main(["train", "--quiet", *RUN, "grpo.max_num_steps=1", f"run_dir={tmp_path}"]) == 0
    assert _recorded(tmp_path / "config.yaml") == "bf16"
    assert _recorded(tmp_path / "checkpoints" / "step_1" / "config.yaml") == "bf16"

    # The same run resumed where the CPU lacks bf16: the recorded bf16 stays, and the run says so.
    monkeypatch.setattr(prec, "cpu_flags", lambda: frozenset({"avx2"}))
    capsys.readouterr()
    assert main(["train", *RUN, "grpo.max_num_steps=2", "checkpointing.resume=true", f"run_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\n  numerics +bf16 on cpu \(auto: recorded by the run that wrote", out)
    assert "resume: policy.precision" not in out  # no change to report: the same value
    assert _recorded(tmp_path / "config.yaml") == "bf16"
    assert _recorded(tmp_path / "checkpoints" / "step_2" / "config.yaml") == "bf16"


def test_an_explicit_precision_is_kept_as_given(tmp_path):
    assert main(["train", "--quiet", *RUN, "grpo.max_num_steps=1", "policy.precision=fp32", f"run_dir={tmp_path}"]) == 0
    assert _recorded(tmp_path / "config.yaml") == "fp32"


def test_a_gpu_policy_is_left_to_decide_for_its_own_device(tmp_path, monkeypatch):
    # The driver's host is not where a cuda/auto policy computes: its choice must not be written for it.
    from rlplane.config.loading import load_config
    from rlplane.training.numerics import numerics, settle_precision

    monkeypatch.setattr(prec, "cpu_flags", lambda: frozenset({"avx2"}))  # this host would choose fp32
    (tmp_path / "config.yaml").write_text("policy: {precision: bf16}\n")
    for device in ("cuda", "auto"):
        cfg = load_config(None, [f"policy.device={device}"])
        assert settle_precision(cfg, "fp32").policy.precision == "auto"
        assert numerics(cfg, tmp_path).precision == "auto"
    cfg = load_config(None, ["policy.tiny.hidden_size=256", "policy.tiny.intermediate_size=256"])
    assert settle_precision(cfg, "fp32").policy.precision == "fp32"
    assert numerics(cfg, tmp_path).precision == "bf16"  # on CPU: what the resumed run recorded
    (tmp_path / "config.yaml").write_text("policy: {precision: auto}\n")  # nothing concrete recorded
    assert numerics(cfg, tmp_path).precision == "fp32"  # this host's choice
