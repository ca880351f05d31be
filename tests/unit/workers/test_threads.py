"""Worker thread count: the user's setting, else OMP_NUM_THREADS, else the cores the process may use."""

import os

import torch

from rlplane.config.loading import load_config
from rlplane.utils.threads import available_cores, set_worker_threads, worker_threads


def test_default_follows_the_affinity_mask_unless_the_user_sets_it(monkeypatch):
    assert load_config(None, []).policy.threads_per_worker is None  # the default: decided at run time
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 5})  # e.g. taskset -c 0,1,5
    assert available_cores() == 3 and worker_threads(None) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # a user's export, or Ray's per-actor share
    assert worker_threads(None) == 2
    assert worker_threads(4) == 4  # policy.threads_per_worker wins over both


def test_set_worker_threads_sets_torch(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
        assert set_worker_threads(None) == 2 and torch.get_num_threads() == 2
        assert set_worker_threads(1) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
