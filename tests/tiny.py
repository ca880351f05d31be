"""What many tests share: the tiny-run preset, and the run's parts built from a config as the run plan builds them.

``TINY_RUN``: the smallest run that still trains (a one-layer 16-wide model, 2 prompts × 2 generations, no
warm-up, no validation, no TensorBoard, a checkpoint each step); a test adds only what it is about:

    cfg = tiny_cfg(tmp_path, "grpo.max_num_steps=3")      # or the ``tiny_run`` fixture: tiny_run("...")

``rollout_worker`` / ``collector``: a rollout worker or an async collector of ``cfg`` (its options, its ``env``
section), as the session gives them.
"""

from __future__ import annotations

from pathlib import Path

TINY_RUN = (
    "warmup.enabled=false", "grpo.num_prompts_per_step=2", "grpo.num_generations_per_prompt=2",
    "policy.train_global_batch_size=4", "policy.train_micro_batch_size=4", "policy.logprob_batch_size=4",
    "grpo.max_num_steps=2", "grpo.val_period=0", "grpo.val_at_start=false", "grpo.max_val_samples=4",
    "grpo.val_batch_size=4", "policy.tiny.hidden_size=16", "policy.tiny.intermediate_size=16",
    "policy.tiny.num_layers=1", "logger.tensorboard_enabled=false", "checkpointing.save_period=1",
)


def tiny_cfg(run_dir: str | Path | None, *overrides: str, preset: str | None = None):
    """The tiny run (``TINY_RUN``, then ``overrides``) writing into ``run_dir`` (None: the config's default)."""
    from rlplane.config.loading import load_config

    where = [f"run_dir={run_dir}"] if run_dir is not None else []
    return load_config(preset, [*TINY_RUN, *where, *overrides])


def rollout_worker(cfg, data_plane=None, *, env_pools=None, **kwargs):
    """A :class:`RolloutWorker` of ``cfg`` (``kwargs``: ``model``, ``tokenizer``, ``seed``, ``shared_paths``)."""
    from rlplane.training.plan import rollout_options
    from rlplane.workers.environments import EnvBlock
    from rlplane.workers.rollout import RolloutWorker

    return RolloutWorker(rollout_options(cfg), EnvBlock(cfg.env, env_pools or {}), data_plane, **kwargs)


def collector(cfg, loader, start_version: int = 0, *, data_plane, seed: int = 0, partition_id: str = "train",
              **kwargs):
    """An :class:`AsyncTrajectoryCollector` of ``cfg`` (its ``grpo`` section's schedule) over ``loader``."""
    from rlplane.async_rl import AsyncOptions, AsyncTrajectoryCollector
    from rlplane.training.plan import rollout_options
    from rlplane.workers.environments import EnvBlock

    return AsyncTrajectoryCollector(rollout_options(cfg), EnvBlock(cfg.env), loader, start_version, seed=seed,
                                    data_plane=data_plane, partition_id=partition_id,
                                    options=AsyncOptions.from_config(cfg.grpo), **kwargs)


def worker_cfg(prompts: int, generations: int, *overrides: str, micro: int | None = None, logprob: int | None = None,
               preset: str | None = None, loop: str = "grpo"):
    """A config for tests of one worker: a step of ``prompts`` × ``generations`` samples trained as one global batch
    (micro-batches of ``micro``, logprobs in batches of ``logprob``: the defaults where not given), no warm-up."""
    from rlplane.config.loading import load_config

    sizes = [f"policy.train_micro_batch_size={micro}"] * (micro is not None) + [
        f"policy.logprob_batch_size={logprob}"] * (logprob is not None)
    return load_config(preset, ["warmup.enabled=false", f"{loop}.num_prompts_per_step={prompts}",
                                f"{loop}.num_generations_per_prompt={generations}",
                                f"policy.train_global_batch_size={prompts * generations}", *sizes, *overrides])
