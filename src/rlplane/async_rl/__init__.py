"""Asynchronous GRPO: a trajectory collector that generates for future weight versions while the
policy trains, and a versioned replay buffer with bounded staleness (``recipes/async_grpo.py``)."""

from rlplane.async_rl.buffer import ReplayBuffer, SampleResult, TrajectoryGroup, buffer_capacity
from rlplane.async_rl.collector import AsyncTrajectoryCollector
from rlplane.async_rl.scheduler import AsyncOptions, Schedule
from rlplane.async_rl.staleness import target_versions

__all__ = ["AsyncOptions", "AsyncTrajectoryCollector", "ReplayBuffer", "SampleResult", "Schedule", "TrajectoryGroup",
           "buffer_capacity", "target_versions"]
