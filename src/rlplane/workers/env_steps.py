"""One environment step of a rollout's turn: returns checked, failed samples isolated, retried, scored 0.
Under ``runtime: ray`` the tasks' actor pools are stepped at once, and the samples a dead actor held fail
together (:class:`EnvActorDied`)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from rlplane.envs.user import EnvReturnError
from rlplane.runtime.deadlines import DeadlineExceeded, call_with_deadline
from rlplane.runtime.env_pools import EnvActorDied
from rlplane.workers.sample_state import SampleState

# The rollout's warnings keep the turn loop's logger name (what users filter on).
log = logging.getLogger("rlplane.workers.turns")


@dataclass(frozen=True)
class EnvSteps:
    """How a rollout steps its environments: ``env_for``, ``renew_env`` (for ``max_retries`` re-runs), and a
    ``timeout_s`` past which :class:`DeadlineExceeded` is raised; ``concurrent``: tasks stepped at once (pools)."""

    env_for: Callable[[str], Any]
    renew_env: Callable[[str], Any] | None = None
    max_retries: int = 0
    timeout_s: float | None = None
    concurrent: bool = False


def step_envs(
    states: list[SampleState],
    active: list[int],
    env_for: Callable[[str], Any],
    renew_env: Callable[[str], Any] | None = None,
    max_retries: int = 0,
    timeout_s: float | None = None,
    concurrent: bool = False,
) -> tuple[int, int]:
    """Step each task's environment on its active samples; returns ``(failed, retried)`` sample counts.

    A batch that raises or is malformed is stepped sample by sample; failed samples are retried up to
    ``max_retries`` times on fresh environments, then get reward 0 and are done. A timeout is never retried.
    With ``concurrent`` the tasks are stepped on threads of their own.
    """
    by_task: dict[str, list[int]] = {}
    for i in active:
        by_task.setdefault(states[i].task_name, []).append(i)

    def run(task: str, rows: list[int]) -> tuple[dict[int, str], int]:
        problems, retried = step_task(env_for(task), task, states, rows, timeout_s), 0
        for _ in range(max_retries if renew_env is not None else 0):
            if not problems:
                break
            retried += len(problems)
            problems = step_task(renew_env(task), task, states, list(problems), timeout_s)
        return problems, retried

    if concurrent and len(by_task) > 1:
        with ThreadPoolExecutor(len(by_task), thread_name_prefix="env-step") as pool:
            outcomes = list(pool.map(run, by_task, by_task.values()))
    else:
        outcomes = [run(task, rows) for task, rows in by_task.items()]
    failed = retried = 0
    for (task, rows), (problems, task_retried) in zip(by_task.items(), outcomes):
        retried += task_retried
        for i in problems:
            s = states[i]
            s.reward, s.env_error, s.done = 0.0, True, True
            s.reward_components = {}  # a failed sample scores 0 in every component too
        if problems:
            first, why = next(iter(problems.items()))
            log.warning(
                "environment %r failed on %d of %d samples (scored 0, counted in env_errors); first, sample %d: %s",
                task, len(problems), len(rows), first, why,
            )
        failed += len(problems)
    return failed, retried


def step_task(env, task: str, states: list[SampleState], rows: list[int], timeout_s: float | None) -> dict[int, str]:
    """Step ``env`` on the samples ``rows`` of ``task``, apply the good returns; the failed samples -> why."""

    def step(batch: list[SampleState]):
        return call_with_deadline(lambda: _checked_step(env, task, batch), timeout_s,
                                  f"environment {task!r}: step on {len(batch)} samples", "env.step_timeout_s")

    problems: dict[int, str] = {}
    try:
        outcomes = [(rows, step([states[i] for i in rows]))]
    except (DeadlineExceeded, EnvReturnError):
        raise
    except EnvActorDied as e:  # the samples a dead actor held fail together; the others are stepped again
        lost = {rows[j] for j in e.rows} if e.rows else set(rows)
        problems = {i: f"EnvActorDied: {e}" for i in rows if i in lost}
        rest = [i for i in rows if i not in lost]
        return {**problems, **(step_task(env, task, states, rest, timeout_s) if rest else {})}
    except Exception:  # isolate the samples that break the environment
        outcomes = []
        for i in rows:
            try:
                outcomes.append(([i], step([states[i]])))
            except DeadlineExceeded:
                raise
            except Exception as e:
                problems[i] = f"{type(e).__name__}: {e}"
    for group, (ret, rewards, terminated, sample_problems, components) in outcomes:
        for j, i in enumerate(group):
            if sample_problems[j]:
                problems[i] = sample_problems[j]
            else:
                _apply(states[i], ret, j, rewards[j], terminated[j], components)
    return problems


def _checked_step(env, task: str, batch: list[SampleState]):
    """Step ``env`` on ``batch``: ``(ret, rewards, terminated, problems, components)``, per-sample problems
    ("" if fine); raises when the return is malformed as a whole."""
    ret = env.step([s.message_log for s in batch], [s.env_info for s in batch])
    n = len(batch)
    fields = ("observations", "metadata", "next_stop_strings", "rewards", "terminateds")
    if not all(hasattr(ret, f) for f in fields):
        raise TypeError(f"environment {task!r} returned a {type(ret).__name__}, not an EnvironmentReturn")
    rewards = torch.as_tensor(ret.rewards, dtype=torch.float32).reshape(-1).tolist()
    if len(rewards) == 1 and n > 1:  # a batch-level score: stepping each sample alone would hand it to each
        raise EnvReturnError(f"environment {task!r} ({type(env).__module__}.{type(env).__qualname__}) returned one "
                             f"reward for {n} samples; return one reward per sample (shape ({n},))")
    terminated = torch.as_tensor(ret.terminateds, dtype=torch.bool).reshape(-1).tolist()
    lengths = {"rewards": len(rewards), "terminateds": len(terminated), "observations": _len(ret.observations)}
    for optional in ("metadata", "next_stop_strings"):  # None means "unchanged" / "no stop strings"
        if getattr(ret, optional) is not None:
            lengths[optional] = _len(getattr(ret, optional))
    wrong = {k: v for k, v in lengths.items() if v != n}
    if wrong:
        raise ValueError(f"environment {task!r} returned " + ", ".join(f"{v} {k}" for k, v in wrong.items())
                         + f" for {n} samples; every list needs one entry per sample")
    # Python floats once per batch.
    components = {name: torch.as_tensor(values).reshape(-1).tolist()
                  for name, values in (getattr(ret, "reward_components", None) or {}).items()}
    for name, values in components.items():
        if len(values) != n:
            raise ValueError(f"environment {task!r} returned reward component {name!r} for "
                             f"{len(values)} of {n} samples")
    problems = [_sample_problem(ret, j, rewards[j], terminated[j]) for j in range(n)]
    return ret, rewards, terminated, problems, components


def _len(x) -> int:
    return len(x) if isinstance(x, (list, tuple)) else -1  # -1: not a list at all


def _sample_problem(ret, j: int, reward: float, terminated: bool) -> str:
    """Why sample ``j`` of an environment's return is malformed ("" if it is not)."""
    if not math.isfinite(reward):
        return f"rewards[{j}] = {reward}, not a finite number"
    if terminated:  # nothing else of a finished sample is read
        return ""
    obs = ret.observations[j]
    if obs is not None and not isinstance(obs, dict):
        return f"observations[{j}] is a {type(obs).__name__}, not a dict {{'role': ..., 'content': ...}}"
    stops = ret.next_stop_strings[j] if ret.next_stop_strings is not None else None
    if stops is not None and not (isinstance(stops, (list, tuple)) and all(isinstance(x, str) for x in stops)):
        return f"next_stop_strings[{j}] = {stops!r}, not None or a list of strings"
    return ""


def _apply(s: SampleState, ret, j: int, reward: float, terminated: bool, components: dict[str, list[float]]) -> None:
    """Add entry ``j`` of a (checked) environment return (``components``: its reward components) to sample ``s``."""
    s.reward += reward
    for name, values in components.items():
        s.reward_components[name] = s.reward_components.get(name, 0.0) + values[j]
    if terminated:
        s.done = s.terminated = True
        return
    obs = ret.observations[j] or {}
    s.message_log.append({"role": obs.get("role", "environment"), "content": str(obs.get("content", ""))})
    if ret.metadata is not None:
        s.env_info = ret.metadata[j]
    s.stop_strings = (list(ret.next_stop_strings[j])
                      if ret.next_stop_strings is not None and ret.next_stop_strings[j] else None)
