"""The Python entry points ``rlplane.train``, ``rlplane.evaluate``, ``rlplane.load_config``, as the command::

    summary = rlplane.train("grpo_arithmetic", overrides=["grpo.max_num_steps=20"],
                            reward_fns={"arithmetic": score})  # score(prompt, completion, extra) -> float

An importable task object is passed on by import path (works with ``runtime: ray``); any other is
registered in this process and needs ``runtime: local``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from rlplane.config.schema import RunConfig

# As the command: quiet Hugging Face progress bars, no telemetry.
for _k, _v in (("TOKENIZERS_PARALLELISM", "false"), ("RAY_USAGE_STATS_ENABLED", "0"),
               ("HF_HUB_DISABLE_PROGRESS_BARS", "1"), ("TRANSFORMERS_VERBOSITY", "error")):
    os.environ.setdefault(_k, _v)


def load_config(config: str | dict | RunConfig | None = None, overrides: Sequence[str] | None = None) -> RunConfig:
    """A validated config from a preset name or YAML path (None: ``grpo_arithmetic``), a dict or a ``RunConfig``,
    with dotted ``overrides``; a NeMo RL file is read as ``rlplane train --config`` reads it."""
    from rlplane.config.loading import (
        apply_overrides,
        build_config,
        dump_config,
        load_config as load_file,
        load_yaml_tree,
    )
    from rlplane.config.yaml_limits import check_tree_bounds
    from rlplane.errors import ConfigError

    if isinstance(overrides, (str, bytes)) or not all(isinstance(o, str) for o in overrides or []):
        raise ConfigError([f"overrides = {overrides!r:.80}: give a list of 'KEY=VALUE' strings, e.g. "
                           "['grpo.max_num_steps=20']"])
    if isinstance(config, RunConfig):
        import yaml

        tree = yaml.safe_load(dump_config(config))
    elif isinstance(config, Mapping):
        check_tree_bounds(config, "config= mapping")
        tree = dict(config)
        parent = tree.pop("defaults", None)
        if parent and not isinstance(parent, str):
            raise ConfigError([f"config['defaults'] = {parent!r:.80}: name one preset or YAML file"])
        if parent:
            from rlplane.config.yaml_tree import deep_merge

            tree = deep_merge(load_yaml_tree(parent), tree)
    elif config is None or isinstance(config, (str, os.PathLike)):
        return load_file(os.fspath(config or "grpo_arithmetic"), list(overrides or []))
    else:
        raise ConfigError([f"config = {config!r:.80}: give a preset name, a YAML path, a dict or a RunConfig"])
    return build_config(apply_overrides(tree, list(overrides or [])))


def _import_path(obj: Any) -> str | None:
    """``module:qualname`` when importing it gives back this very object, else None."""
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if not module or module == "__main__" or "<" in name or "." in name:
        return None
    try:
        return f"{module}:{name}" if getattr(importlib.import_module(module), name, None) is obj else None
    except ImportError:
        return None


def _user_task_overrides(cfg: RunConfig, envs: Mapping | None, reward_fns: Mapping | None):
    """(overrides naming importable tasks by path, {task: factory} to register in this process)."""
    from rlplane.errors import ConfigError

    overrides, local = [], {}
    for kind, given in (("reward_fn", reward_fns or {}), ("class", envs or {})):
        for task, obj in given.items():
            path = obj if isinstance(obj, str) else _import_path(obj)
            if path is not None:
                overrides.append(f"env.{task}.{kind}={path}")
                continue
            if cfg.runtime != "local":
                raise ConfigError([f"{kind}s[{task!r}] = {obj!r}: the Ray rollout actor imports user code by path, "
                                   "and this object has none (defined in __main__, a lambda or nested); move it into "
                                   "a module, pass 'module:name', or use runtime: local"])
            local[task] = _reward_factory(obj, task) if kind == "reward_fn" else _env_factory(obj, task)
    return overrides, local


def _reward_factory(fn: Callable, task: str) -> Callable:
    from rlplane.envs.user import LOCAL_TASK_ATTR, RewardFnEnv, check_reward_fn

    where = f"reward_fns[{task!r}]"
    check_reward_fn(fn, where, getattr(fn, "__name__", repr(fn)))

    def factory(**kwargs):
        return RewardFnEnv(fn, where, **kwargs)

    setattr(factory, LOCAL_TASK_ATTR, where)  # checked against the data's task names at start-up
    return factory


def _env_factory(cls: type, task: str) -> Callable:
    from rlplane.envs.user import LOCAL_TASK_ATTR, UserTaskError, one_line

    where = f"envs[{task!r}]"

    def factory(**kwargs):
        try:
            return cls(**kwargs)
        except (Exception, SystemExit) as e:  # the user's constructor failed: their error, in one line
            raise UserTaskError(f"{where} = {getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', cls)}: "
                                f"constructing it raised {one_line(e)}") from None

    factory.reward_component_names = tuple(getattr(cls, "reward_component_names", ()))
    setattr(factory, LOCAL_TASK_ATTR, where)
    return factory


@contextmanager
def _user_code_exit():
    """``sys.exit()`` in user task code ends the run as a :class:`UserTaskError` naming where."""
    from rlplane.envs.user import UserTaskError, user_exit_message

    try:
        yield
    except SystemExit as e:
        raise UserTaskError(user_exit_message(e)) from None


@contextmanager
def _registered(factories: Mapping[str, Callable]):
    """Register ``factories`` for the duration of a run, then restore the registry."""
    from rlplane.envs.registry import ENV_REGISTRY

    saved = dict(ENV_REGISTRY)
    ENV_REGISTRY.update(factories)
    try:
        yield
    finally:
        ENV_REGISTRY.clear()
        ENV_REGISTRY.update(saved)


def _prepare(config, overrides, envs, reward_fns) -> tuple[RunConfig, dict]:
    cfg = load_config(config, overrides)
    extra, local = _user_task_overrides(cfg, envs, reward_fns)
    if extra:
        cfg = load_config(cfg, extra)
    return cfg, local


def train(config: str | dict | RunConfig | None = None, *, overrides: Sequence[str] | None = None,
          envs: Mapping[str, Any] | None = None, reward_fns: Mapping[str, Any] | None = None,
          quiet: bool = False, loss_fn: Any = None, task_to_env: Mapping[str, Any] | None = None,
          val_task_to_env: Mapping[str, Any] | None = None,
          dataset: Any = None, val_dataset: Any = None, dataloader: Any = None, logger: Any = None,
          policy: Any = None, policy_generation: Any = None, checkpointer: Any = None) -> dict:
    """Warm-up (if enabled) and the config's recipe, as ``rlplane train``; returns the summary.

    ``reward_fns``: task -> ``fn(prompt, completion, extra) -> float`` or ``"module:function"``; ``envs``: task
    -> :class:`rlplane.envs.Environment` class or ``"module:Class"``. Parts as objects, as NeMo RL's ``grpo_train``
    takes them (:mod:`rlplane.training.components`): ``loss_fn``, ``task_to_env`` / ``val_task_to_env`` (task ->
    environment object, ``runtime: local``; validation's as ``env.val_task_to_env``), ``dataset`` / ``val_dataset``
    or ``dataloader``, ``logger`` (``log_metrics``), ``policy``, ``policy_generation``, ``checkpointer`` (an
    object, or a wrapper of the run's own)."""
    from rlplane.config.recipes import recipe_for, train_function
    from rlplane.errors import ConfigError
    from rlplane.training.components import Components

    cfg, local = _prepare(config, overrides, envs, reward_fns)
    if dataset is not None and dataloader is not None:
        raise ConfigError(["rlplane.train: give dataset or dataloader, not both"])
    for given, validation in ((task_to_env, False), (val_task_to_env, True)):
        for task, env in (given or {}).items():
            if cfg.runtime != "local":
                raise ConfigError([f"{'val_' * validation}task_to_env[{task!r}]: an environment object lives in "
                                   "this process; use runtime: local, or pass its class as envs={...} (or "
                                   "env.<task>.class)"])
            if validation:  # registered under a name of its own, which env.val_task_to_env names
                local[f"{task}{VALIDATION_SUFFIX}"] = _object_factory(env, task, checked=False)
            else:
                local[task] = _object_factory(env, task)
    if val_task_to_env:
        cfg = load_config(cfg, [f"env.val_task_to_env.{t}={t}{VALIDATION_SUFFIX}" for t in val_task_to_env])
    run = train_function(recipe_for(cfg))
    parts = Components(loss_fn=loss_fn, dataset=dataset, val_dataset=val_dataset, dataloader=dataloader,
                       logger=logger, policy=policy, policy_generation=policy_generation, checkpointer=checkpointer)
    parts.check()
    with _registered(local), _user_code_exit():
        return run(cfg, quiet=quiet, components=parts)


VALIDATION_SUFFIX = "@validation"  # registry name of a val_task_to_env object: <task>@validation


def _object_factory(env: Any, task: str, checked: bool = True) -> Callable:
    """A registry factory that hands out the given environment object itself (kwargs of the config unused);
    ``checked``: the data must name ``task`` (a validation environment's name is its own)."""
    from rlplane.envs.user import LOCAL_TASK_ATTR

    def factory(**_kwargs):
        return env

    factory.reward_component_names = tuple(getattr(env, "reward_component_names", ()))
    if checked:
        setattr(factory, LOCAL_TASK_ATTR, f"task_to_env[{task!r}]")
    return factory


def evaluate(config: str | dict | RunConfig | None = None, *, overrides: Sequence[str] | None = None,
             model: str | None = None, checkpoint: str | None = None, envs: Mapping[str, Any] | None = None,
             reward_fns: Mapping[str, Any] | None = None, num_problems: int | None = None, k: int = 1,
             batch_size: int = 32, progress: bool = False) -> dict:
    """Greedy accuracy (and pass@k when ``k > 1``) on the held-out problems, as ``rlplane eval``.

    ``checkpoint``: a run directory (its latest checkpoint and saved config) or a ``step_N`` directory."""
    from rlplane.checkpoint_source import checkpoint_weights
    from rlplane.errors import ConfigError
    from rlplane.evaluation import evaluate as run

    problems = [f"{name} = {value!r}: must be an integer >= 1" for name, value in
                (("num_problems", num_problems), ("k", k), ("batch_size", batch_size))
                if (value is not None or name != "num_problems")
                and (isinstance(value, bool) or not isinstance(value, int) or value < 1)]
    if model is not None and checkpoint is not None:
        problems.append("rlplane.evaluate: give model or checkpoint, not both")
    if problems:
        raise ConfigError(problems)
    extra = [f"policy.model_name={model}"] if model else []
    if checkpoint is not None:
        weights, ckpt = checkpoint_weights(checkpoint)
        extra = [f"policy.model_name={weights}"]
        if config is None and ckpt is not None and (ckpt / "config.yaml").is_file():
            config = str(ckpt / "config.yaml")  # the run's own data, prompt format and environments
    cfg, local = _prepare(config, [*(overrides or []), *extra, "warmup.enabled=false", "runtime=local"],
                          envs, reward_fns)
    with _registered(local), _user_code_exit():
        return run(cfg, num_problems=num_problems, k=k, batch_size=batch_size, progress=progress)
