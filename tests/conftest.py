"""Test-session set-up shared by every tier.

Torch threads are pinned and OpenMP told not to spin: on a 2-core machine a spinning neighbour
slows torch 3-30x. One Ray instance serves the whole session (start-up costs ~3 s).
"""

from __future__ import annotations

import os
import signal
import tempfile

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

torch.set_num_threads(1)

# The signal tests start runs as from a terminal: a suite launched as a script's background job (SIGINT
# ignored) or under nohup (SIGHUP ignored) would otherwise pass those ignores on to every run it starts.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.fixture(scope="session")
def ray_session():
    """A Ray instance shared by every test that needs one; shut down at session end."""
    import ray

    if not ray.is_initialized():
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            object_store_memory=512 * 2**20,
            _temp_dir=tempfile.mkdtemp(prefix="rlplane-ray-"),
            runtime_env={"env_vars": {"OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}},
        )
    yield ray
    # Left running until interpreter exit: shutting down and restarting costs seconds per test module.


@pytest.fixture(autouse=True)
def _restore_env_registry():
    """Environments registered by a test (directly, or by a run naming user tasks in its config) do
    not leak into later tests' "known environments" lists."""
    from rlplane.envs.registry import ENV_REGISTRY

    saved = dict(ENV_REGISTRY)
    yield
    ENV_REGISTRY.clear()
    ENV_REGISTRY.update(saved)


@pytest.fixture
def tiny_run(tmp_path):
    """The shared tiny-run preset (``tests/tiny.py``: ``TINY_RUN``) writing into this test's ``tmp_path / "run"``:
    ``tiny_run("grpo.max_num_steps=3")`` is its RunConfig with that override; ``preset=`` starts from a preset."""
    from tests.tiny import tiny_cfg

    def make(*overrides: str, preset: str | None = None):
        return tiny_cfg(tmp_path / "run", *overrides, preset=preset)

    return make


def pytest_addoption(parser):
    parser.addoption("--heavy", action="store_true",
                     help="also run the heavy tier (minutes each: NeMo RL's largest example configs at their own "
                          "batch sizes); the README's test command leaves it out to stay within CI's time")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--heavy"):
        return
    skip = pytest.mark.skip(reason="heavy tier, minutes each: `pytest --heavy` runs it")
    for item in items:
        if "heavy" in item.keywords:
            item.add_marker(skip)
