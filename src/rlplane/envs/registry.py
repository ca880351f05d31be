"""``task_name`` -> environment. Samples are routed to environments by their ``DatumSpec.task_name``."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from rlplane.envs.interface import Environment

# name -> factory, or "module:attribute" imported on first use (so optional extras stay optional).
ENV_REGISTRY: dict[str, Callable[..., Environment] | str] = {
    "arithmetic": "rlplane.envs.arithmetic:ArithmeticEnv",
    "calculator": "rlplane.envs.calculator:CalculatorEnv",
    "code": "rlplane.envs.code:CodeEnv",
    "math": "rlplane.envs.math_env:MathEnv",
    "reasoning_gym": "rlplane.envs.reasoning_gym_env:ReasoningGymEnv",
    "guess_number": "rlplane.envs.guess_number:GuessNumberEnv",
    "short_answer": "rlplane.envs.short_answer:ShortAnswerEnv",
    "math_multi_reward": "rlplane.envs.math_multi_reward:MathMultiRewardEnv",
    "sliding_puzzle_game": "rlplane.envs.sliding_puzzle:SlidingPuzzleEnv",
}


class UnknownEnvironmentError(ValueError):
    """A task name with no registered environment (one-line message for the user)."""


def register_env(name: str, factory: Callable[..., Environment]) -> None:
    """Make ``name`` resolve to ``factory(**kwargs)``; re-registering a name replaces it."""
    ENV_REGISTRY[name] = factory


def _factory(name: str) -> Callable[..., Environment]:
    factory = ENV_REGISTRY[name]
    if isinstance(factory, str):
        module, _, attribute = factory.partition(":")
        factory = getattr(importlib.import_module(module), attribute)
    return factory


def reward_component_names(name: str) -> tuple[str, ...] | None:
    """The reward components ``name``'s environment declares, without building it; None if unknown or unimportable."""
    try:
        factory = _factory(name)
    except (KeyError, ImportError):
        return None
    return tuple(getattr(factory, "reward_component_names", ()))


def create_env(name: str, **kwargs: Any) -> Environment:
    """Instantiate the environment registered for ``name``."""
    if name not in ENV_REGISTRY:
        known = ", ".join(sorted(ENV_REGISTRY))
        raise UnknownEnvironmentError(
            f"task_name {name!r}: no environment registered; known: {known} (add one with rlplane.envs.register_env)"
        )
    try:
        factory = _factory(name)
        return factory(**kwargs)
    except ModuleNotFoundError as e:  # an optional extra that is not installed
        raise UnknownEnvironmentError(f"task_name {name!r}: {e}") from None


def check_task_names(task_names, where: str) -> None:
    """Raise a one-line ``UnknownEnvironmentError`` if a task name in ``task_names`` has no environment."""
    unknown = sorted(set(task_names) - set(ENV_REGISTRY))
    if unknown:
        known = ", ".join(sorted(ENV_REGISTRY))
        raise UnknownEnvironmentError(
            f"{where}: task_name {unknown[0]!r} has no environment (known: {known}); fix the data's task_name "
            "or register one with rlplane.envs.register_env"
        )


def create_envs(task_names, env_kwargs: dict[str, dict[str, Any]] | None = None) -> dict[str, Environment]:
    """One environment per distinct task name: the ``task_to_env`` map a rollout uses."""
    env_kwargs = env_kwargs or {}
    return {name: create_env(name, **env_kwargs.get(name, {})) for name in dict.fromkeys(task_names)}


class _Unsendable:
    """Stands in, in another process, for a factory that could not be pickled: building it says why."""

    def __init__(self, name: str, factory: str, reason: str):
        self.name, self.factory, self.reason = name, factory, reason

    def __call__(self, **kwargs: Any) -> Environment:
        raise UnknownEnvironmentError(
            f"task_name {self.name!r}: its environment factory {self.factory} cannot be sent to a worker process "
            f"({self.reason}); register a class or function defined at module level, or run the worker in the "
            "driver's process (grpo.async_grpo.collector_process=false)"
        )


def env_registry_snapshot() -> dict[str, Any]:
    """This process's registry, sendable to a worker process (run-time registrations go by reference)."""
    import pickle

    out: dict[str, Any] = {}
    for name, factory in ENV_REGISTRY.items():
        try:
            pickle.dumps(factory)
            out[name] = factory
        except Exception as e:  # noqa: BLE001 - a lambda, a class defined in a function, ...
            out[name] = _Unsendable(name, repr(factory), f"{type(e).__name__}: {e}")
    return out


def sendable_env_names() -> set[str]:
    """The registered names whose factory can be sent to another process (:func:`env_registry_snapshot`)."""
    return {name for name, entry in env_registry_snapshot().items() if not isinstance(entry, _Unsendable)}


def restore_env_registry(entries: dict[str, Any]) -> None:
    """Install a registry snapshot taken in another process."""
    ENV_REGISTRY.update(entries)
