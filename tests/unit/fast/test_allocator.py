"""keep_freed_memory: glibc keeps a freed 64 MiB block in the heap when on, unmaps it when off."""

import os
import subprocess
import sys

import pytest

from rlplane.fast import allocator

glibc = pytest.mark.skipif(not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"),
                           reason="mallopt and mallinfo2 are glibc's")

# Run in a fresh process (the settings are process-wide and cannot be undone): malloc 64 MiB, read
# glibc's counters while it is held and after free. hblkhd: bytes in mmapped blocks; fordblks: free
# bytes kept in the heap.
_PROBE = """
import ctypes
from rlplane.fast import allocator
applied = allocator.keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
before = libc.mallinfo2()
block = libc.malloc(64 << 20)
held = libc.mallinfo2()
libc.free(block)
after = libc.mallinfo2()
print(applied, held.hblkhd - before.hblkhd, after.fordblks - before.fordblks)
"""


def _probe(env_value: str | None) -> tuple[bool, int, int]:
    env = {k: v for k, v in os.environ.items() if k != allocator.ENV_VAR}
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    env.pop("MALLOC_TRIM_THRESHOLD_", None)
    if env_value is not None:
        env[allocator.ENV_VAR] = env_value
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True)
    applied, mapped, kept = out.stdout.split()
    return applied == "True", int(mapped), int(kept)


@glibc
def test_freed_block_stays_in_the_heap():
    applied, mapped, kept = _probe(None)
    assert applied
    assert mapped < 64 << 20  # served from the heap, not a fresh mmap
    assert kept >= 64 << 20  # and still there after free (not trimmed)


@glibc
def test_off_switch_leaves_glibc_defaults():
    applied, mapped, kept = _probe("0")
    assert not applied
    assert mapped >= 64 << 20  # glibc's default: a block this size is mmapped
    assert kept < 64 << 20  # and unmapped on free


def test_mallopt_called_once_per_process(monkeypatch):
    calls = []
    monkeypatch.setattr(allocator, "_applied", None)
    monkeypatch.setattr(allocator, "_mallopt_keep", lambda: calls.append(1) or True)
    monkeypatch.delenv(allocator.ENV_VAR, raising=False)
    assert allocator.keep_freed_memory() and allocator.keep_freed_memory()
    assert calls == [1]


@pytest.mark.parametrize("value", ["0", "false", "OFF", "no"])
def test_env_var_turns_it_off(monkeypatch, value):
    monkeypatch.setattr(allocator, "_applied", None)
    monkeypatch.setattr(allocator, "_mallopt_keep", lambda: pytest.fail("mallopt called though switched off"))
    monkeypatch.setenv(allocator.ENV_VAR, value)
    assert allocator.keep_freed_memory() is False


def test_hf_backend_applies_it(monkeypatch):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlplane.generation import hf

    calls = []
    monkeypatch.setattr(hf, "keep_freed_memory", lambda: calls.append(1) or True)

    class Tok:
        pad_token_id = 0
        eos_token_id = 1

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    hf.HFGenerationBackend(model, Tok())
    assert calls == [1]


@glibc
def test_glibc_that_caps_the_mmap_threshold_gets_its_cap(monkeypatch):
    # glibc before 2.35 (?) refuses an mmap threshold above HEAP_MAX_SIZE / 2 = 32 MiB on 64-bit:
    # then the cap is set, which still covers a 64-row SmolLM2 logits tensor (64 x 49152 x 4 B = 12.6 MB).
    calls = []

    class CappedLibc:
        def mallopt(self, param, value):
            calls.append((param, value))
            return int(param != allocator._M_MMAP_THRESHOLD or value <= 32 << 20)

    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: CappedLibc())
    assert allocator._mallopt_keep()
    assert calls == [(allocator._M_MMAP_THRESHOLD, allocator.KEEP_BYTES), (allocator._M_MMAP_THRESHOLD, 32 << 20),
                     (allocator._M_TRIM_THRESHOLD, allocator.KEEP_BYTES)]


# Threads that allocate at once each get an arena of their own, up to glibc's limit; malloc_stats prints one
# "Arena N:" block per arena on stderr.
_ARENAS = """
import ctypes, threading
from rlplane.fast import allocator
applied = allocator.limit_malloc_arenas()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
barrier = threading.Barrier(12)
def work():
    barrier.wait()
    blocks = [libc.malloc(4096) for _ in range(64)]
    barrier.wait()
    for b in blocks:
        libc.free(b)
threads = [threading.Thread(target=work) for _ in range(12)]
for t in threads: t.start()
for t in threads: t.join()
print(applied, flush=True)
libc.malloc_stats()
"""


def _arenas(env_value: str | None) -> tuple[bool, int]:
    env = {k: v for k, v in os.environ.items() if k not in (allocator.FEW_ARENAS_VAR, "MALLOC_ARENA_MAX")}
    if env_value is not None:
        env[allocator.FEW_ARENAS_VAR] = env_value
    out = subprocess.run([sys.executable, "-c", _ARENAS], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip() == "True", out.stderr.count("Arena ")


@glibc
def test_threads_share_few_arenas():
    applied, arenas = _arenas(None)
    assert applied and arenas == allocator.MALLOC_ARENAS


@glibc
def test_off_switch_leaves_an_arena_per_thread():
    applied, arenas = _arenas("0")
    assert not applied and arenas > allocator.MALLOC_ARENAS


def test_hf_backend_limits_the_arenas(monkeypatch):
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlplane.generation import hf

    calls = []
    monkeypatch.setattr(hf, "limit_malloc_arenas", lambda: calls.append(1) or True)

    class Tok:
        pad_token_id = 0
        eos_token_id = 1

    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    hf.HFGenerationBackend(model, Tok())
    assert calls == [1]


@pytest.mark.parametrize("device, expected", [("cpu", ["keep", "arenas"]), ("meta", [])])
def test_a_cpu_trainer_keeps_freed_memory_too(monkeypatch, device, expected):
    """A training process without a generator in it (a Ray policy or value worker) keeps its freed memory as well;
    a device other than the CPU leaves the host allocator alone."""
    import torch

    from rlplane.config.loading import load_config
    from rlplane.workers import trainer
    from rlplane.workers.rank import DPRank

    calls = []
    monkeypatch.setattr(trainer, "keep_freed_memory", lambda: calls.append("keep") or True)
    monkeypatch.setattr(trainer, "limit_malloc_arenas", lambda: calls.append("arenas") or True)
    cfg = load_config(None, [])
    rank = DPRank("test", cfg.policy, None, rank=0, world_size=1, shared_paths=None)
    monkeypatch.setattr(rank, "device", torch.device(device))
    trainer.Trainer(torch.nn.Linear(2, 2), cfg.policy.optimizer, cfg.policy.scheduler, rank)
    assert calls == expected
