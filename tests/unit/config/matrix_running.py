"""Running and judging the bad-input matrix's cases (``test_bad_input_matrix.py``): in this process through
``main``, in a batch in one fresh interpreter (an environment of its own: a Hugging Face cache, a silent server,
an unprivileged user), or as the console script in a process of its own.

A verdict is ``one-line`` (exit 2, stderr exactly one ``rlplane: error:`` line, the user's files unchanged, no
checkpoint written by a ``train`` that failed), ``ok`` (a correct run: exit 0, no error line, the user's files
unchanged), ``traceback``, or ``wrong: why``.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import traceback
from pathlib import Path

import matrix_cases as C

from rlplane.cli import main

AFTER: list = []  # a case's own clean-up (a lock its setup holds), run after the case


def snapshot(*roots: Path) -> dict[str, str]:
    """Each file's content hash (a large file's size and modification time; a FIFO or device: its kind)."""
    out = {}
    for root in roots:
        for dirpath, _, files in os.walk(root):
            for f in files:
                if f == ".rlplane.lock":  # rlplane's own: a run rewrites its holder's pid there
                    continue
                p = os.path.join(dirpath, f)
                st = os.stat(p)
                if not stat.S_ISREG(st.st_mode):  # opening a FIFO would wait for a writer
                    out[p] = f"mode {stat.S_IFMT(st.st_mode)}"
                elif st.st_size > 1 << 20:
                    out[p] = f"{st.st_size} bytes, mtime {st.st_mtime_ns}"
                else:
                    with open(p, "rb") as fh:
                        out[p] = hashlib.sha1(fh.read()).hexdigest()
    return out


def judge(rc, err: str, escaped: str | None, before: dict, after: dict, argv: list[str],
          expect: str = "one-line") -> str:
    if escaped is not None or "Traceback" in err:
        return "traceback"
    lines = err.strip().splitlines()
    if expect == "runs":
        errors = [ln for ln in lines if ln.startswith("rlplane: error:")]
        if rc != 0 or errors:
            return f"wrong: expected a run, got exit status {rc}: {errors[:1] or lines[-1:]}"
        changed = [p for p, h in before.items() if after.get(p) != h]
        return f"wrong: changed or removed the user's {changed[:2]}" if changed else "ok"
    if rc != 2:
        return f"wrong: exit status {rc}"
    if len(lines) != 1 or not lines[0].startswith("rlplane: error:"):
        return f"wrong: stderr is {len(lines)} lines: {lines[:3]}"
    changed = [p for p, h in before.items() if after.get(p) != h]
    if changed:
        return f"wrong: changed or removed the user's {changed[:2]}"
    new_ckpts = [p for p in after if p not in before and "/checkpoints/step_" in p]
    if argv[:1] == ["train"] and new_ckpts:
        return f"wrong: trained before failing ({new_ckpts[0]})"
    return "one-line"


def fill(items, world: Path, t: Path) -> list[str]:
    return [a.replace("{w}", str(world)).replace("{t}", str(t)) for a in items]


def run_case(argv_t: list[str], world: Path, t: Path, capsys, setup, expect: str = "one-line") -> tuple[str, str]:
    """A CLI case in this process: (verdict, what it printed or raised)."""
    try:
        if setup is not None:
            setup(world, t)
        argv = fill(argv_t, world, t)
        before = snapshot(world, t)
        capsys.readouterr()
        escaped, rc = None, None
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
        except BaseException:  # noqa: BLE001 - the point is to see it
            escaped = traceback.format_exc()
        err = capsys.readouterr().err
        verdict = judge(rc, err, escaped, before, snapshot(world, t), argv, expect)
        return verdict, (escaped or err).strip()
    finally:
        while C.MOUNTS:  # a full-disk case's tmpfs
            subprocess.run(["umount", "-l", C.MOUNTS.pop()], check=False)
        while AFTER:
            AFTER.pop()()


def console(argv: list[str], env: dict[str, str], cwd: Path, **kw) -> subprocess.Popen:
    """The console script in a process (and process group) of its own."""
    full = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **env}
    return subprocess.Popen([sys.executable, "-m", "rlplane.cli", *argv], env=full, cwd=cwd, text=True,
                            stderr=subprocess.PIPE, start_new_session=True, **kw)


# Cases (id, argv, environment) through ``main`` in one interpreter: {id: [exit status, stderr]} as JSON.
BATCH_SCRIPT = """
import contextlib, io, json, os, sys
from rlplane.cli import main

out = {}
for cid, argv, env in json.loads(sys.argv[1]):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
        except BaseException as e:
            rc, err = None, io.StringIO("Traceback: " + repr(e))
    out[cid] = [rc, err.getvalue()]
    for k, v in saved.items():
        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
print(json.dumps(out))
"""


def run_batch(cases: list[tuple[str, list[str], dict[str, str]]], *, env: dict[str, str], cwd: Path,
              timeout: float = 300) -> dict[str, list]:
    """``cases`` through ``main`` in one fresh interpreter with ``env`` (over this one's, Ray's address removed)."""
    full = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **env}
    full.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-c", BATCH_SCRIPT, json.dumps(cases)], capture_output=True, text=True,
                          env=full, cwd=cwd, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def judge_batched(rc, err: str, expect: str, says: str = "") -> str:
    """A batched case's verdict from its exit status and stderr (``says``: words its one line must hold)."""
    lines = err.strip().splitlines()
    if "Traceback" in err:
        return "traceback"
    if expect == "runs":
        errors = [ln for ln in lines if ln.startswith("rlplane: error:")]
        return "ok" if rc == 0 and not errors else f"wrong: expected a run, got exit status {rc}: {lines[-1:]}"
    if rc == 2 and len(lines) == 1 and lines[0].startswith("rlplane: error:") and says in lines[0]:
        return "one-line"
    return f"wrong: exit status {rc}, stderr {lines[:2]}"


def surface_counts(results: dict[str, str]) -> dict[str, dict[str, int]]:
    """Per surface (the case id's first part): one-line errors, correct runs (ok), tracebacks, wrong behaviours,
    and what is missing (known, built elsewhere)."""
    out: dict[str, dict[str, int]] = {}
    for cid, verdict in sorted(results.items()):
        row = out.setdefault(cid.split("/")[0], {"one-line": 0, "ok": 0, "traceback": 0, "wrong": 0, "missing": 0})
        row[verdict.split(":")[0] if verdict.startswith(("wrong", "missing")) else verdict] += 1
    return out
