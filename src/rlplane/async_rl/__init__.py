"""Asynchronous GRPO: a trajectory collector that generates for future weight versions while the
policy trains, and a versioned replay buffer with bounded staleness (``recipes/async_grpo.py``)."""

from rlplane.async_rl.buffer import ReplayBuffer, SampleResult, TrajectoryGroup, buffer_capacity

__all__ = ["ReplayBuffer", "SampleResult", "TrajectoryGroup", "buffer_capacity"]
