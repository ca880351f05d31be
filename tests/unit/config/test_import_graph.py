"""Checking a config imports nothing heavy: ``--help``, ``show-config`` of every preset and of NeMo RL files,
and a config mistake under every command print before torch, transformers or Ray is imported (seconds on 2
cores). An import graph, not a timing: ``benchmarks/import_times.py`` measures the seconds.

All commands run through ``main`` in one fresh interpreter (one start for the lot); after each, the script
prints which heavy modules ``sys.modules`` holds. A command that pulls one in taints the later ones too, so
the first offender is the one to look at.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rlplane.config.yaml_tree import list_presets

HEAVY = ("torch", "transformers", "ray", "datasets", "vllm", "numpy")
NEMO = Path(__file__).resolve().parents[2] / "fixtures" / "nemo"

SCRIPT = """
import contextlib, io, json, sys
from rlplane.cli import main

HEAVY = {heavy!r}
out = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
    out.append({{"argv": argv, "rc": rc, "heavy": [m for m in HEAVY if m in sys.modules],
                "last": err.getvalue().strip().splitlines()[-1:]}})
print(json.dumps(out))
"""


def _commands(tmp: Path) -> list[list[str]]:
    typo = "grpo.max_num_step=3"
    return [
        ["--help"], ["train", "--help"], ["eval", "--help"], ["sweep", "--help"],
        *(["show-config", "-c", p] for p in list_presets()),
        *(["show-config", "-c", str(f), "data.dataset=arithmetic"] for f in sorted(NEMO.glob("*.yaml"))),
        ["show-config", "-c", str(NEMO / "grpo_math_1B.yaml")],  # refused: NeMo RL's dataset registry
        ["show-config", typo], ["train", typo], ["sft", typo], ["train", "-c", "ppo_arithmetic", typo], ["sweep", typo],
        ["eval", "--model", "embedded:tiny-llama", typo], ["eval", "--checkpoint", str(tmp / "nope")],
        ["export", "--checkpoint", str(tmp / "nope"), "-o", str(tmp / "out")],
        ["train", "-c", str(tmp / "nope.yaml")], ["train", "grpo.adv_estimator.name=nope"],
        ["train", "policy.optimizer.betas=[0.9,1.5]", "loss_fn.ratio_clip_c=0.5"],
        ["train", "data.dataset=registry", "data.train.name=nope"],  # NeMo RL's dataset names: plain tables
        ["train", "data.dataset=registry", "data.train.name=gsm8k", "data.train.options.nope=1"],
        ["sweep", "--seeds", "1", "--variant", "grpo.nope=1"],  # every run's config, checked before the first
    ]


def test_config_checks_import_no_torch_transformers_or_ray(tmp_path):
    commands = _commands(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(heavy=HEAVY), json.dumps(commands)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout)
    assert [r["argv"] for r in results] == commands
    offenders = [r for r in results if r["heavy"]]
    assert not offenders, f"first command that imported {offenders[0]['heavy']}: {offenders[0]['argv']}"
    # Each ran to its verdict: help and the good configs exit 0, the mistakes exit 2 with an error line.
    for r in results:
        mistake = any("max_num_step=" in a or "nope" in a or "betas" in a for a in r["argv"]) or r["argv"][-1:] == [
            str(NEMO / "grpo_math_1B.yaml")]
        assert r["rc"] == (2 if mistake else 0), r
        if mistake:
            assert r["last"][0].startswith("rlplane: error:"), r


def test_every_user_error_the_cli_catches_lives_where_it_says():
    """The CLI catches user errors from the modules already imported; a class that moved would go uncaught."""
    import importlib

    from rlplane.cli import USER_ERRORS

    for module, name in USER_ERRORS:
        cls = getattr(importlib.import_module(module), name)
        assert cls.__module__ == module and issubclass(cls, Exception), (module, name)


def test_the_algorithms_package_still_offers_every_name():
    """Its names load on first use (its modules import torch); each is its home module's own object."""
    import importlib

    import rlplane.algorithms as algorithms

    home_of = {name: module for module, names in algorithms._HOMES.items() for name in names}
    assert sorted(home_of) == algorithms.__all__
    for name in algorithms.__all__:
        home = importlib.import_module(f"rlplane.algorithms.{home_of[name]}")
        assert getattr(algorithms, name) is getattr(home, name), name
