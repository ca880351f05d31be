"""Every speed setting on against every one off (RLPLANE_FAST=0): the same generation, and each setting
really applied or not. Fresh processes: the allocator and heap settings cannot be undone."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rlplane.fast import switches

_RUN = """
import gc, json, torch
from rlplane.fast import allocator
from rlplane.fast.heap import freeze_heap
from rlplane.fast.threads import set_worker_threads
from rlplane.generation import HFGenerationBackend
from rlplane.models import build_char_tokenizer, build_tiny_llama
set_worker_threads(None)
tok = build_char_tokenizer()
model = build_tiny_llama(tok, hidden_size=32, num_layers=2, num_heads=2, seed=0).eval()
with torch.no_grad():
    for p in model.parameters():
        p.mul_(12 if p.dim() > 1 else 1)
backend = HFGenerationBackend(model, tok)
frozen = freeze_heap()
out = backend.generate([[1, 5, 6, 7], [1, 9], [1, 4, 4, 8, 12]] * 2, max_new_tokens=8, seed=3)
print(json.dumps(dict(ids=out.output_ids, logprobs=[lp.tolist() for lp in out.logprobs],
                      decode=backend.last_decode, frozen=frozen > 0, kept=allocator.keep_freed_memory())))
"""


def _run(**env) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RLPLANE_")}
    out = subprocess.run([sys.executable, "-c", _RUN], env={**base, **env}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_all_settings_off_give_the_same_generation():
    fast, plain = _run(), _run(**{switches.ALL: "0"})
    assert (fast["decode"], fast["frozen"]) == ("fused", True)
    assert (plain["decode"], plain["frozen"], plain["kept"]) == ("hf", False, False)
    assert fast["ids"] == plain["ids"]
    for a, b in zip(fast["logprobs"], plain["logprobs"]):
        assert a == pytest.approx(b, abs=1e-4)


@pytest.mark.parametrize("value, on", [(None, True), ("1", True), ("0", False), ("off", False), ("False", False)])
def test_enabled_reads_the_variable_and_the_master_switch(monkeypatch, value, on):
    monkeypatch.delenv(switches.ALL, raising=False)
    if value is None:
        monkeypatch.delenv(switches.FREEZE_HEAP, raising=False)
    else:
        monkeypatch.setenv(switches.FREEZE_HEAP, value)
    assert switches.enabled(switches.FREEZE_HEAP) is on
    monkeypatch.setenv(switches.ALL, "0")
    assert switches.enabled(switches.FREEZE_HEAP) is False
