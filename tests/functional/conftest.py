"""Fixtures shared by the functional tests."""

from __future__ import annotations

import pytest
import torch


class FirstDigitEnv:
    """Reward 1 when the response starts with an odd digit: varied rewards even from random weights."""

    def step(self, message_logs, metadata):
        from rlplane.envs import EnvironmentReturn, last_assistant_content

        texts = [last_assistant_content(m) for m in message_logs]
        rewards = torch.tensor([float(t[:1] in "13579" and t[:1] != "") for t in texts])
        n = len(texts)
        return EnvironmentReturn([{}] * n, [None] * n, [None] * n, rewards, torch.ones(n, dtype=torch.bool), None)


@pytest.fixture
def first_digit_env():
    from rlplane.envs import ENV_REGISTRY, register_env

    saved = dict(ENV_REGISTRY)
    register_env("arithmetic", FirstDigitEnv)
    yield
    ENV_REGISTRY.clear()
    ENV_REGISTRY.update(saved)
