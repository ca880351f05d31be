"""Environments: the seeds' ``step(message_logs, metadata) -> EnvironmentReturn`` interface and a registry."""

from rlplane.envs.arithmetic import ArithmeticEnv, extract_answer, score_answer, score_answers
from rlplane.envs.interface import EnvBatch, Environment, EnvironmentReturn, last_assistant_content
from rlplane.envs.registry import (
    ENV_REGISTRY,
    UnknownEnvironmentError,
    check_task_names,
    create_env,
    create_envs,
    register_env,
)

__all__ = [
    "ENV_REGISTRY",
    "ArithmeticEnv",
    "EnvBatch",
    "Environment",
    "EnvironmentReturn",
    "UnknownEnvironmentError",
    "check_task_names",
    "create_env",
    "create_envs",
    "extract_answer",
    "last_assistant_content",
    "register_env",
    "score_answer",
    "score_answers",
]
