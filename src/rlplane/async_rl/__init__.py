"""Asynchronous GRPO: a collector generating for future weight versions, a replay buffer with bounded staleness."""

from rlplane.async_rl.buffer import ReplayBuffer, SampleResult, TrajectoryGroup, buffer_capacity
from rlplane.async_rl.collector import AsyncTrajectoryCollector
from rlplane.async_rl.scheduler import AsyncOptions, Schedule
from rlplane.async_rl.staleness import target_versions

__all__ = ["AsyncOptions", "AsyncTrajectoryCollector", "ReplayBuffer", "SampleResult", "Schedule", "TrajectoryGroup",
           "buffer_capacity", "target_versions"]
