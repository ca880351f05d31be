"""User tasks named by import path in the config: ``env.<task>.reward_fn`` or ``env.<task>.class``.

A reward function is called per sample as ``fn(prompt, completion, extra, **kwargs) -> float`` (or a list
of floats, summed): ``completion`` is the decoded last answer, ``extra`` the row's ``extra_env_info``;
single-turn. An environment class follows :class:`rlplane.envs.Environment`, built as ``Class(**kwargs)``.
Only the path travels, imported where the environment runs (``RLPLANE_IMPORT_PATH`` for Ray actors);
:func:`check_user_tasks` calls each task once on a real row at start-up.
"""

from __future__ import annotations

import collections
import functools
import importlib
import inspect
import math
import os
import sys
import sysconfig
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rlplane.envs.interface import Environment, EnvironmentReturn, last_assistant_content
from rlplane.envs.registry import ENV_REGISTRY, UnknownEnvironmentError

IMPORT_PATH_VAR = "RLPLANE_IMPORT_PATH"


class UserTaskError(UnknownEnvironmentError):
    """A user task's import path, signature or return value is wrong (one-line message)."""


class EnvReturnError(UserTaskError):
    """An environment's return is wrong for the batch as a whole: the run stops."""


class EnvErrorWindow:
    """Stops a run whose environments fail on more than ``max_rate`` of the samples (``train/env_error_rate``)
    on average over the last ``window`` steps; ``max_rate`` None never stops."""

    def __init__(self, max_rate: float | None, window: int):
        self.max_rate, self.rates = max_rate, collections.deque(maxlen=window)

    def check(self, metrics: dict[str, float]) -> None:
        rate = metrics.get("train/env_error_rate")
        if self.max_rate is None or rate is None:
            return
        self.rates.append(float(rate))
        mean = sum(self.rates) / len(self.rates)
        if mean > self.max_rate:
            raise UserTaskError(
                f"environments failed on {mean:.0%} of the samples over the last {len(self.rates)} steps, above "
                f"env.max_error_rate = {self.max_rate} (the warnings above say why); fix the environment or reward "
                "function, or raise env.max_error_rate (null: never stop)")


def import_path_env() -> dict[str, str]:
    """Environment variables that make the driver's working directory importable in a Ray actor."""
    dirs = [os.getcwd(), *filter(None, os.environ.get(IMPORT_PATH_VAR, "").split(os.pathsep))]
    return {IMPORT_PATH_VAR: os.pathsep.join(dict.fromkeys(dirs))}


def _extend_sys_path() -> None:
    # The working directory first (a console script's sys.path lacks it), then the driver's (Ray actors).
    for d in [os.getcwd(), *filter(None, os.environ.get(IMPORT_PATH_VAR, "").split(os.pathsep))]:
        if d not in sys.path:
            sys.path.append(d)


def import_object(path: str, where: str) -> Any:
    """``module:attribute`` from the working directory or an installed package; ``where``: the config key."""
    _extend_sys_path()
    module_name, _, attribute = path.partition(":")
    head = f"{where} = {path!r}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise UserTaskError(
                f"{head}: no module named {e.name!r} in the working directory ({os.getcwd()}) or the installed "
                f"packages; check the spelling, or run from the directory that holds {e.name.split('.')[0]}.py"
            ) from None
        raise UserTaskError(f"{head}: importing {module_name} failed: {e}; install what it needs") from None
    except Exception as e:  # a syntax or runtime error in the user's module
        raise UserTaskError(f"{head}: importing {module_name} raised {type(e).__name__}: {e}") from None
    if not hasattr(module, attribute):
        names = ", ".join(n for n in sorted(vars(module)) if not n.startswith("_"))[:200]
        raise UserTaskError(f"{head}: {module_name} ({getattr(module, '__file__', '?')}) has no {attribute!r}; "
                            f"it defines: {names}")
    return getattr(module, attribute)


def as_reward(value: Any, where: str) -> float:
    """A reward function's return as one float: a number, or a list of numbers (summed)."""
    parts = list(value) if isinstance(value, (list, tuple)) else [value]
    total = 0.0
    for v in parts:
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = v.item()
        try:
            if isinstance(v, str):
                raise TypeError
            f = float(v)
        except (TypeError, ValueError):
            raise UserTaskError(f"{where} returned {value!r} ({type(value).__name__}); return a float "
                                "(or a list of floats)") from None
        if not math.isfinite(f):
            raise UserTaskError(f"{where} returned {value!r}; rewards must be finite numbers")
        total += f
    return total


def prompt_text(message_log: list[dict]) -> str:
    """The prompt: every message before the first assistant turn, concatenated."""
    out = []
    for m in message_log:
        if m.get("role") == "assistant":
            break
        out.append(str(m.get("content", "")))
    return "".join(out)


class RewardFnEnv(Environment):
    """A single-turn environment around ``fn(prompt, completion, extra, **kwargs) -> float``."""

    def __init__(self, fn: Callable[..., Any], where: str, **kwargs: Any):
        self.fn, self.where, self.kwargs = fn, where, kwargs

    def step(self, message_logs: Sequence[list[dict]], metadata: Sequence[Any]) -> EnvironmentReturn:
        rewards, answers = [], []
        for log, extra in zip(message_logs, metadata):
            completion = last_assistant_content(log)
            rewards.append(as_reward(self.fn(prompt_text(log), completion, extra, **self.kwargs), self.where))
            answers.append(completion)
        n = len(message_logs)
        return EnvironmentReturn(
            observations=[{"role": "environment", "content": ""}] * n,
            metadata=list(metadata),
            next_stop_strings=[None] * n,
            rewards=torch.tensor(rewards, dtype=torch.float32),
            terminateds=torch.ones(n, dtype=torch.bool),
            answers=answers,
        )


def _check_call(target: Callable, args: tuple, kwargs: dict, where: str, path: str, expected: str) -> None:
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):  # builtins without a signature: let the call decide
        return
    try:
        sig.bind(*args, **kwargs)
    except TypeError as e:
        raise UserTaskError(f"{where} = {path!r}: cannot be called as {expected} (its signature is {sig}: {e}); "
                            "change its parameters or env kwargs") from None


def check_reward_fn(fn: Any, where: str, shown: str, kwargs: dict[str, Any] | None = None) -> None:
    """A one-line error unless ``fn(prompt, completion, extra, **kwargs)`` can be called."""
    if not callable(fn):
        raise UserTaskError(f"{where} = {shown!r}: is a {type(fn).__name__}, not a function")
    _check_call(fn, ("prompt", "completion", {}), kwargs or {}, where, shown, "fn(prompt, completion, extra, **kwargs)")


def load_reward_fn(path: str, where: str, kwargs: dict[str, Any]) -> Callable[..., Any]:
    fn = import_object(path, where)
    check_reward_fn(fn, where, path, kwargs)
    return fn


def load_env_class(path: str, where: str, kwargs: dict[str, Any]) -> type:
    cls = import_object(path, where)
    if not isinstance(cls, type) or not callable(getattr(cls, "step", None)):
        raise UserTaskError(f"{where} = {path!r}: not a class with a step(message_logs, metadata) method; "
                            "subclass rlplane.envs.Environment")
    _check_call(cls, (), kwargs, where, path, "Class(**kwargs)")
    return cls


def make_user_env(task_name: str, reward_fn: str | None, class_path: str | None, **kwargs: Any) -> Environment:
    """Build a user task's environment (imports its module here, in the calling process)."""
    if reward_fn is not None:
        where = f"env.{task_name}.reward_fn"
        return RewardFnEnv(load_reward_fn(reward_fn, where, kwargs), where, **kwargs)
    where = f"env.{task_name}.class"
    cls = load_env_class(class_path, where, kwargs)
    try:
        return cls(**kwargs)
    except (Exception, SystemExit) as e:  # the user's constructor failed: their error, in one line
        raise UserTaskError(f"{where} = {class_path!r}: {cls.__name__}(**env kwargs) raised "
                            f"{one_line(e)}; fix the class or its env.{task_name}.kwargs") from None


def one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}" if text else type(e).__name__


def _library_file(path: str) -> bool:
    """Whether ``path`` is an installed package's or the standard library's (not the user's code)."""
    return "site-packages" in path or "dist-packages" in path or path.startswith(sysconfig.get_paths()["stdlib"])


def user_exit_message(e: SystemExit | KeyboardInterrupt) -> str:
    """One line for a ``SystemExit`` from user code in a run (or a ``KeyboardInterrupt`` it raised in a thread,
    which no Ctrl-C reaches), named by the deepest frame of the user's code (a library may wrap sys.exit, as
    wandb's exit hook does)."""
    tb = e.__traceback__
    user_tb = None
    while tb is not None:
        if not _library_file(tb.tb_frame.f_code.co_filename):
            user_tb = tb
        last, tb = tb, tb.tb_next
    tb = user_tb or (last if e.__traceback__ is not None else None)
    frame = tb.tb_frame if tb is not None else None
    where = (f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_name} ({frame.f_code.co_filename}:"
             f"{tb.tb_lineno})" if frame is not None else "user code")
    did = f"called sys.exit({e.code!r})" if isinstance(e, SystemExit) else f"raised {type(e).__name__}"
    return (f"{where} {did} during the run; a reward function or environment must return "
            "(or raise), not exit: the run stopped as failed")


def register_user_tasks(env_cfg, import_now: bool = False) -> None:
    """Route each user task of ``env_cfg`` to its factory in this process's registry; ``import_now`` (a rollout
    worker) imports the modules here, so a bad path fails the start."""
    for name, task in env_cfg.user_tasks().items():
        ENV_REGISTRY[name] = functools.partial(make_user_env, name, task.reward_fn, task.class_)
        if import_now:
            key = "reward_fn" if task.reward_fn else "class"
            import_object(task.reward_fn or task.class_, f"env.{name}.{key}")


def user_task_error_in(err: BaseException, actor: str = "the Ray rollout actor") -> UserTaskError | None:
    """The :class:`UserTaskError` that killed a Ray actor at start-up, from the error Ray raises, if any."""
    text = str(err)
    marker = "UserTaskError: "
    if marker not in text:
        return None
    line = text[text.rindex(marker) + len(marker):].strip().splitlines()[0]
    return UserTaskError(f"{line} (in {actor})")


LOCAL_TASK_ATTR = "rlplane_user_task"  # set on a factory registered for a Python object (rlplane.train(reward_fns=))


def check_task_names(env_cfg, datums: Sequence[Any]) -> None:
    """A user task no row names would never be called (a misspelt task): an error naming the data's tasks; a
    validation environment (``env.val_task_to_env``) that is none."""
    for task, env in env_cfg.val_task_to_env.items():  # else the first validation, after training, finds out
        if env not in ENV_REGISTRY:
            raise UserTaskError(f"env.val_task_to_env.{task} = {env!r}: no such environment (known: "
                                f"{', '.join(sorted(ENV_REGISTRY))}); name one, or a user task env.{env}.reward_fn / "
                                "class")
    if not datums:
        return
    have = dict.fromkeys(d.task_name for d in datums)
    named = {name: f"env.{name}.{'reward_fn' if t.reward_fn else 'class'}" for name, t in env_cfg.user_tasks().items()}
    named.update({name: getattr(f, LOCAL_TASK_ATTR) for name, f in ENV_REGISTRY.items() if hasattr(f, LOCAL_TASK_ATTR)})
    for name, where in named.items():
        if name not in have:
            raise UserTaskError(f"{where}: no training or validation row has task_name {name!r} (the data's tasks: "
                                f"{', '.join(map(str, have))}), so it would never be called; check the spelling")


def _direct(fn: Callable[[], Any], what: str) -> Any:
    return fn()


def check_user_tasks(env_cfg, datums: Sequence[Any], within: Callable[[Callable[[], Any], str], Any] = _direct) -> None:
    """Import every user task and step it once on one of its rows (reference answer as completion), so a
    wrong path, signature or return is one line before training; also :func:`check_task_names`.
    ``within(fn, what)`` makes each user call (constructor, step): the caller's deadline."""
    register_user_tasks(env_cfg)
    check_task_names(env_cfg, datums)
    for name, task in env_cfg.user_tasks().items():
        where = f"env.{name}.reward_fn" if task.reward_fn else f"env.{name}.class"
        shown = f"{where} = {task.reward_fn or task.class_!r}"
        env = within(lambda: make_user_env(name, task.reward_fn, task.class_, **task.kwargs),
                     f"start-up check: {shown}: building it")
        datum = next((d for d in datums if d.task_name == name), None)
        try:
            if datum is None:
                continue
            info = dict(datum.extra_env_info) if isinstance(datum.extra_env_info, dict) else datum.extra_env_info
            log = [dict(m) for m in datum.message_log]
            log.append({"role": "assistant", "content": str(datum.ground_truth or "")})
            try:
                ret = within(lambda: env.step([log], [info]), f"start-up check: {shown} on row {datum.idx}")
            except UserTaskError:
                raise
            except Exception as e:
                raise UserTaskError(f"{where}: raised {type(e).__name__}: {e} on row {datum.idx} "
                                    f"(completion = its reference answer)") from None
            if not isinstance(ret, EnvironmentReturn) and not hasattr(ret, "rewards"):
                raise UserTaskError(f"{where}: step returned {type(ret).__name__}; "
                                    "return an rlplane.envs.EnvironmentReturn")
            try:
                rewards = torch.as_tensor(ret.rewards, dtype=torch.float32).reshape(-1)
            except (TypeError, ValueError, RuntimeError):
                raise UserTaskError(f"{where}: step's rewards = {ret.rewards!r} are not numbers; "
                                    "return a float tensor with one reward per sample") from None
            if rewards.numel() != 1 or not torch.isfinite(rewards).all():
                raise UserTaskError(f"{where}: step returned rewards {rewards.tolist()} for 1 sample; "
                                    "return one finite reward per sample")
        finally:
            close = getattr(env, "close", None)
            if callable(close):
                close()
