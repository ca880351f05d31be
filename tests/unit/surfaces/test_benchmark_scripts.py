"""Every script in benchmarks/ still imports against the package: names move between modules, and a benchmark
that no longer starts is found here rather than when a figure is due. Each is loaded as a module in one child
interpreter (its ``main`` is not run), so torch is imported once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = """
import importlib.util, json, sys, traceback
failed = {}
for path in sys.argv[1:]:
    spec = importlib.util.spec_from_file_location("bench_" + path.rsplit("/", 1)[-1][:-3], path)
    try:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    except BaseException as e:  # noqa: BLE001
        failed[path] = traceback.format_exception_only(type(e), e)[-1].strip()
print(json.dumps(failed))
"""


def test_every_benchmark_script_imports():
    scripts = sorted(str(p) for p in (ROOT / "benchmarks").glob("*.py"))
    assert scripts
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks"), *sys.path])}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *scripts], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {}
