"""Wiring shared by the recipes: data, data plane, workers, refit, checkpoints, logging.

The recipe files hold the loops; this module builds what they loop over. A :class:`Session`
owns the workers (in-process or Ray actors), the data plane client and the run directory.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from rlplane.config.loading import ConfigError, dump_config
from rlplane.config.schema import RunConfig
from rlplane.data import (
    ArithmeticDataset,
    ArithmeticSpec,
    JsonlFields,
    PromptDataLoader,
    PromptDataset,
    build_eval_set,
    read_jsonl_rows,
)
from rlplane.data.hf_files import read_hf_rows
from rlplane.data.processors import resolve_prompt_format
from rlplane.data.reasoning_gym import reasoning_gym_rows
from rlplane.dataplane import make_data_plane, shard_meta_for_dp
from rlplane.envs import check_task_names
from rlplane.envs.demonstrations import warmup_examples
from rlplane.envs.user import check_user_tasks, import_path_env, register_user_tasks, user_task_error_in
from rlplane.recipes.sft import supervised_warmup
from rlplane.runtime.devices import check_cluster_gpus, num_gpus_per_worker
from rlplane.runtime.groups import LocalGroup, RayGroup, init_ray
from rlplane.utils.checkpoint import (
    CheckpointError,
    CheckpointManager,
    check_weights_fit,
    load_torch_state,
    weight_shapes,
)
from rlplane.utils.logging import MetricsLogger, text_table
from rlplane.utils.progress import Progress
from rlplane.utils.run_dir import prepare_run_paths
from rlplane.utils.trackers import make_trackers
from rlplane.workers.base import load_configured_policy
from rlplane.workers.deadlines import ray_get
from rlplane.workers.parallel import check_resume_layout
from rlplane.workers.policy import PolicyWorker
from rlplane.workers.rollout import RolloutWorker
from rlplane.workers.value import ValueWorker
from rlplane.utils.threads import set_worker_threads


def build_datasets(cfg: RunConfig, tokenizer, *, train: bool = True):
    """(train loader, held-out datums, stats) from ``data.*``; with ``train=False`` the loader is None
    (evaluation builds only the held-out set). Every task name must have an environment."""
    d, g = cfg.data, cfg.loop
    register_user_tasks(cfg.env)  # user task names are known environments from here on
    # A prompt must leave room for at least one generated token.
    max_prompt = cfg.policy.max_total_sequence_length - 1
    fmt = resolve_prompt_format(d.prompt, tokenizer)
    stats: dict[str, int] = {"skipped_overlong": 0}
    train_ds = None

    def tokenized(rows, source):
        ds = PromptDataset(rows, tokenizer, max_prompt_length=max_prompt, on_overlong=d.on_overlong_prompt,
                           prompt_format=fmt, source=source)
        stats["skipped_overlong"] += ds.num_skipped_overlong
        return ds

    if d.dataset == "arithmetic":
        a = d.arithmetic
        spec = ArithmeticSpec(operators=tuple(a.operators), operand_min=a.min_operand, operand_max=a.max_operand)
        if train:
            train_ds = ArithmeticDataset(tokenizer, spec, num_problems=d.num_train_samples, seed=g.seed,
                                         max_prompt_length=max_prompt, prompt_format=fmt, task_name=a.task_name)
        val = build_eval_set(tokenizer, spec, num_problems=g.max_val_samples, prompt_format=fmt, task_name=a.task_name)
    elif d.dataset == "reasoning_gym":
        r = d.reasoning_gym
        val_rows = reasoning_gym_rows(r.tasks, r.val_size, r.val_seed, r.config)
        val = list(tokenized(val_rows, "reasoning_gym held-out problems").datums)
        if train:
            held_out = {row["problem"] for row in val_rows}
            train_rows = reasoning_gym_rows(r.tasks, r.train_size, r.train_seed, r.config, exclude_questions=held_out)
            train_ds = tokenized(train_rows, "reasoning_gym training problems")
    elif d.dataset == "guess_number":
        from rlplane.envs.guess_number import GuessNumberDataset

        r = cfg.env.guess_number
        if train:
            train_ds = GuessNumberDataset(tokenizer, d.num_train_samples, low=r.low, high=r.high, seed=g.seed)
        val_ds = GuessNumberDataset(tokenizer, g.max_val_samples, low=r.low, high=r.high, seed=g.seed + 1)
        val = [val_ds[i] for i in range(len(val_ds))]
    else:
        def rows(j):
            fields = JsonlFields(problem=j.problem_key, answer=j.answer_key, task_name=j.task_name_key,
                                 default_task_name=j.default_task_name)
            if d.dataset == "hf":
                return read_hf_rows(j.path, fields, j.format, j.split)
            return read_jsonl_rows(j.path, fields)

        train_source = f"dataset {d.train.path}"
        if train or d.validation is None:
            train_ds = tokenized(rows(d.train), train_source)
            check_task_names((x.task_name for x in train_ds.datums), train_source)
        if d.validation is not None:
            val_source = f"dataset {d.validation.path}"
            val = list(tokenized(rows(d.validation), val_source).datums)
            check_task_names((x.task_name for x in val), val_source)
        else:
            val = list(train_ds.datums[: g.max_val_samples])
        if not train:
            train_ds = None
    loader = None
    if train_ds is not None:
        loader = PromptDataLoader(train_ds, g.num_prompts_per_step * g.batch_multiplier, seed=g.seed, shuffle=d.shuffle)
    return loader, val, stats


# CPUs each Ray actor asks for (``_start_workers``, async GRPO's collector).
RAY_CPUS_POLICY_RANK, RAY_CPUS_ROLLOUT, RAY_CPUS_CRITIC_RANK, RAY_CPUS_COLLECTOR = 0.5, 0.5, 0.25, 0.5
# An actor that has not started by then never will (or the cluster is overloaded): fail, do not hang.
ACTOR_START_TIMEOUT_S = 300.0


def ray_cpu_demand(cfg: RunConfig, uses_critic: bool) -> float:
    """CPUs the run's Ray actors ask for together; Ray never schedules an actor it cannot fit, so a
    demand above the cluster's CPUs would wait forever."""
    n = cfg.policy.dp_size
    demand = n * RAY_CPUS_POLICY_RANK + RAY_CPUS_ROLLOUT
    if uses_critic:
        demand += n * RAY_CPUS_CRITIC_RANK
    if cfg.algorithm == "grpo" and cfg.grpo.async_grpo.enabled:
        demand += RAY_CPUS_COLLECTOR
    return demand


def check_ray_resources(cfg: RunConfig, uses_critic: bool, cluster_cpus: float | None = None) -> None:
    """A one-line :class:`ConfigError` when the actors cannot all fit the Ray cluster's CPUs
    (``cluster_cpus``, default ``ray.cluster_resources()``)."""
    if cluster_cpus is None:
        import ray

        cluster_cpus = float(ray.cluster_resources().get("CPU", 0))
    demand = ray_cpu_demand(cfg, uses_critic)
    if demand > cluster_cpus:
        parts = f"{RAY_CPUS_POLICY_RANK:g} per policy rank + {RAY_CPUS_ROLLOUT:g} rollout"
        parts += f" + {RAY_CPUS_CRITIC_RANK:g} per critic rank" if uses_critic else ""
        parts += f" + {RAY_CPUS_COLLECTOR:g} collector" if cfg.algorithm == "grpo" and cfg.grpo.async_grpo.enabled else ""
        raise ConfigError([
            f"policy.dp_size = {cfg.policy.dp_size}: the Ray actors need {demand:g} CPUs ({parts}) but the Ray cluster "
            f"has {cluster_cpus:g}; lower policy.dp_size, or give Ray more CPUs (cluster.num_cpus, cluster.address)"
        ])


def await_actors(actors: list, timeout_s: float = ACTOR_START_TIMEOUT_S) -> None:
    """Wait until every actor answers ``ping`` (its constructor finished); a one-line error after
    ``timeout_s`` instead of a hang when one can never be scheduled."""
    import ray

    refs = [a.ping.remote() for a in actors]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if len(ready) < len(refs):
        raise ConfigError([
            f"runtime=ray: {len(refs) - len(ready)} of {len(refs)} worker actors did not start within {timeout_s:g} s "
            "(the Ray cluster lacks free CPUs or memory for them); free the cluster, lower policy.dp_size, or give Ray "
            "more (cluster.num_cpus, cluster.address)"
        ])
    ray.get(ready)  # a constructor that raised raises here


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Session:
    def __init__(self, cfg: RunConfig, quiet: bool = False):
        self.cfg = cfg
        self.quiet = quiet
        self.progress = Progress(cfg.loop.max_num_steps, cfg.algorithm, cfg.logger.log_every_n_steps,
                                 enabled=not quiet, bar=cfg.logger.progress_bar)  # before anything that may say()
        # Absolute, created and writable, and no earlier run there unless resuming: checked first.
        self.paths = prepare_run_paths(cfg)
        self.run_dir = self.paths.run_dir
        set_worker_threads(cfg.policy.threads_per_worker)
        seed_everything(cfg.loop.seed)
        self.initial_validation: dict[str, float] = {}
        self.warmup_result: dict[str, float] = {}
        self._stale = False
        self._refit_local = False
        self._t_start = time.perf_counter()
        ck = cfg.checkpointing
        self.ckpt = CheckpointManager(self.paths.checkpoint_dir, ck.keep_top_k, ck.metric_name, ck.higher_is_better)
        # Tokenizer, data and the checkpoint to resume first: their errors surface before anything slow starts.
        model, self.tokenizer = load_configured_policy(cfg)
        self._resume_state: dict = {}
        self._resume_from = self._check_resume(model) if ck.resume else None
        del model
        self.train_loader, self.val_datums, self.data_stats = build_datasets(cfg, self.tokenizer)
        if self.data_stats.get("skipped_overlong"):
            self.say(f"skipped {self.data_stats['skipped_overlong']} prompts longer than policy.max_total_sequence_length")
        self._train_iter = iter(self.train_loader)
        check_user_tasks(cfg.env, [*self.val_datums, *getattr(self.train_loader.dataset, "datums", [])])
        # PPO with GAE trains a critic; GRPO and PPO's raw_reward estimator do not.
        self.uses_critic = cfg.algorithm == "ppo" and cfg.ppo.adv_estimator.name == "gae"
        if cfg.runtime == "ray" or cfg.data_plane.backend == "ray":
            init_ray(cfg.cluster.num_cpus, cfg.cluster.address, cfg.cluster.gpus_per_node or None)
        if cfg.runtime == "ray":
            check_ray_resources(cfg, self.uses_critic)
        self.data_plane = make_data_plane(cfg.data_plane.backend)
        self.needs_reference = (
            cfg.loss_fn.reference_policy_kl_penalty != 0 and not cfg.loop.skip_reference_policy_logprobs_calculation
        )
        self.loss_kwargs = cfg.loss_fn.model_dump()
        trackers = make_trackers(cfg.logger, self.run_dir.name, self.paths.log_dir, cfg.model_dump(mode="json"))
        self.logger = MetricsLogger(self.paths.log_dir, cfg.logger.jsonl_enabled, cfg.logger.tensorboard_enabled, trackers)
        # (kind, rows) sample tables waiting for the next log() (validation and training samples), and
        # the last step logged (training samples are due by step).
        self.pending_samples: list[tuple[str, list[dict]]] = []
        self.last_logged_step = 0
        self.policy = None
        self.value = None
        self.rollout_worker = None
        # Extra state a recipe keeps in each checkpoint (file name -> state getter, written with
        # torch.save; async GRPO's replay buffer), the checkpoint a run resumed from, and what
        # close() must stop first.
        self.checkpoint_parts: dict[str, Callable[[], object]] = {}
        self.resumed_from: Path | None = None
        self.closers: list[Callable[[], None]] = []
        self.collector = None  # async GRPO's trajectory collector, once started

    # ---- console -----------------------------------------------------------------------------------
    def say(self, msg: str) -> None:
        if not self.quiet:
            self.progress.write(msg)

    # ---- workers -----------------------------------------------------------------------------------
    def _start_workers(self, init_state: dict | None) -> None:
        cfg = self.cfg
        n = cfg.policy.dp_size
        kwargs = [dict(cfg=cfg, data_plane=self.data_plane, rank=r, world_size=n, init_state=init_state) for r in range(n)]
        if cfg.runtime == "local":
            self.policy = LocalGroup(PolicyWorker, kwargs)
            w = self.policy.workers[0]
            # Colocated: the generator shares the policy's module, so refit costs nothing.
            self.rollout_worker = RolloutWorker(cfg, self.data_plane, model=w.model, tokenizer=w.tokenizer,
                                                seed=cfg.loop.seed)
            self._rollout_remote = False
            # hf samples from the policy's own module; vllm holds a copy that needs a refit per step.
            self._refit_local = not self.rollout_worker.backend.shares_weights
            if self.uses_critic:
                self.value = LocalGroup(ValueWorker, kwargs)
        else:
            import ray

            cluster_gpus = ray.cluster_resources().get("GPU", 0)
            check_cluster_gpus(cfg.policy.device, n * (1 + self.uses_critic), cluster_gpus)
            gpus = num_gpus_per_worker(cfg.policy.device, cluster_gpus)
            self.policy = RayGroup(PolicyWorker, kwargs, num_cpus=RAY_CPUS_POLICY_RANK, num_gpus=gpus)
            await_actors(self.policy.workers)
            sharded = cfg.policy.dtensor_cfg.enabled  # FSDP needs its process group even on one rank
            if n > 1 or sharded:
                address = ray.get(self.policy.workers[0].node_address.remote())
                self.policy.run("setup_distributed", address)
            if self.uses_critic:
                # A quarter CPU each: policy (0.5/rank) + rollout (0.5) + critic still fit Ray's 2 CPUs at dp_size 2.
                self.value = RayGroup(ValueWorker, kwargs, num_cpus=RAY_CPUS_CRITIC_RANK, num_gpus=gpus)
                await_actors(self.value.workers)
                if n > 1 or sharded:  # its own gloo group: every actor is its own process
                    self.value.run("setup_distributed", ray.get(self.value.workers[0].node_address.remote()))
            remote = ray.remote(num_cpus=RAY_CPUS_ROLLOUT, runtime_env={"env_vars": {"OMP_WAIT_POLICY": "PASSIVE",
                                                                                  **import_path_env()}})(RolloutWorker)
            self.rollout_worker = remote.remote(cfg, self.data_plane, seed=cfg.loop.seed)
            self._rollout_remote = True
            self._stale = True  # the rollout actor built its own weights: push the policy's now
            try:
                self.refit_if_stale()
            except ray.exceptions.RayActorError as e:  # e.g. a user task the actor's node cannot import
                raise user_task_error_in(e) or e from None

    def rollout(self, method: str, *args, **kwargs):
        if self._rollout_remote:  # a deadline hit inside the actor comes out as its one line (ray_get)
            return ray_get(getattr(self.rollout_worker, method).remote(*args, **kwargs))
        return getattr(self.rollout_worker, method)(*args, **kwargs)

    def policy_sharded(self, method: str, meta, batch_size: int | None = None, **kwargs) -> list:
        """Shard ``meta`` over the DP ranks and call ``method`` on each with its shard."""
        return self._sharded(self.policy, method, meta, batch_size, **kwargs)

    def value_sharded(self, method: str, meta, batch_size: int | None = None, **kwargs) -> list:
        """The same over the critic's ranks (same DP size and sharding as the policy)."""
        return self._sharded(self.value, method, meta, batch_size, **kwargs)

    def _sharded(self, group, method: str, meta, batch_size: int | None, **kwargs) -> list:
        metas, _ = shard_meta_for_dp(meta, self.cfg.policy.dp_size, batch_size=batch_size)
        return group.run(method, per_rank=[{"meta": m} for m in metas], **kwargs)

    def mark_stale(self) -> None:
        self._stale = self._rollout_remote or self._refit_local

    def refit_if_stale(self) -> None:
        """Push the policy's weights into the generator (a separate actor, or a backend with its own copy)."""
        if self._stale and not self._rollout_remote:
            self.rollout_worker.update_weights(self.policy.workers[0].get_weights())  # merged, under LoRA
            self._stale = False
        if self._stale:
            import ray

            # The ref goes straight from the rank-0 actor to the rollout actor; the driver never holds it.
            # Under FSDP get_weights is a gather every rank takes part in (rank 0 gets the weights).
            refs = [w.get_weights.remote() for w in self.policy.workers[: len(self.policy) if
                                                                  self.cfg.policy.dtensor_cfg.enabled else 1]]
            ray.get([self.rollout_worker.update_weights.remote(refs[0]), *refs[1:]])
            self._stale = False

    def next_prompts(self) -> list:
        try:
            return next(self._train_iter)
        except StopIteration:
            self._train_iter = iter(self.train_loader)
            return next(self._train_iter)

    # ---- warm-up or resume -----------------------------------------------------------------------
    def _check_resume(self, model: torch.nn.Module) -> Path | None:
        """Repair what a crash mid-save left, then check the latest checkpoint on the driver (its info,
        its files, its weights' names and shapes against ``model``) so that a damaged checkpoint or a
        different model shape is a one-line error before any worker starts. Returns it (or None)."""
        for what in self.ckpt.repair():
            self.say(f"checkpoint {what}")
        latest = self.ckpt.latest()
        if latest is None:
            return None
        self.ckpt.load_info(latest)
        if not (latest / "policy" / "optimizer.pt").is_file():
            raise CheckpointError(f"checkpoint {latest}: policy/optimizer.pt is missing (an incomplete checkpoint); "
                                  f"delete {latest} to resume from the one before")
        # Small: read them now, so that a damaged one is an error before any worker starts.
        self._resume_state = {"dataloader": load_torch_state(latest / "dataloader.pt"),
                              "rng": load_torch_state(latest / "rng.pt")}
        fix = (f"resume with the policy settings of the run that wrote it ({latest / 'config.yaml'}), or start a new "
               "run_dir")
        check_weights_fit(model, latest / "policy" / "weights", fix)
        if (latest / "value" / "weights").is_dir():
            weight_shapes(latest / "value" / "weights")  # damaged or truncated: say so now
        return latest

    def resume_or_warm_up(self) -> int:
        """Load the checkpoint found at start-up (or warm up and start fresh workers); returns the step
        to continue from. Only once that worked is anything of an earlier run touched."""
        cfg = self.cfg
        latest = self._resume_from
        if latest is not None:
            check_resume_layout(str(latest / "policy"), cfg.policy.dp_size, cfg.policy.dtensor_cfg.enabled)
            self._start_workers(init_state=None)
            info = self.ckpt.load_info(latest)
            self.policy.run("load", str(latest / "policy"))
            if self.value is not None:
                self.value.run("load", str(latest / "value"))
            self.train_loader.load_state_dict(self._resume_state["dataloader"])
            self._train_iter = iter(self.train_loader)
            rng = self._resume_state["rng"]
            torch.set_rng_state(rng["torch"])
            self.rollout("set_rng_state", rng["rollout"])
            self.initial_validation = info.get("initial_validation", {})
            self.warmup_result = info.get("warmup", {})
            self._stale = self._rollout_remote or self._refit_local
            self.resumed_from = latest
            self.last_logged_step = int(info["step"])
            self.say(f"resumed from {latest} at step {info['step']}")
            step = int(info["step"])
        else:
            init_state = self._warm_up() if cfg.warmup.enabled else None
            self._start_workers(init_state)
            step = 0
        if cfg.checkpointing.resume:
            # The killed stretch's rows (past the checkpoint) are redone: drop them; with nothing to
            # resume the run starts over and keeps none.
            if dropped := self.logger.drop_after(step if latest is not None else -1):
                self.say(f"dropped {dropped} metrics rows logged after the checkpoint (those steps are redone)")
        self.write_config()
        return step

    def write_config(self) -> None:
        """``run_dir/config.yaml``: written once the run has really started (a run that failed its
        checks leaves none, so running it again is not refused as an earlier run)."""
        (self.run_dir / "config.yaml").write_text(dump_config(self.cfg))

    def _warm_up(self) -> dict:
        cfg = self.cfg
        model, tok = load_configured_policy(cfg)
        # The warm-up trains `model` in place and evaluates it as it goes: sample from that very module
        # (hf), whatever backend the run uses (a vllm engine here would hold stale weights).
        gen_cfg = cfg.policy.generation.model_copy(update={"backend": "hf"})
        eval_cfg = cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"generation": gen_cfg})})
        evaluator = RolloutWorker(eval_cfg, None, model=model, tokenizer=tok, seed=cfg.loop.seed + 1)
        val = self.val_datums[: cfg.warmup.eval_samples]
        sft_rows = self.train_loader.dataset
        rng = random.Random(cfg.loop.seed + 2)

        def batches(n: int):
            # (prompt, answer + eos) per problem; an env with a demonstration gives one example per turn.
            picks = [sft_rows[rng.randrange(len(sft_rows))] for _ in range(n)]
            examples = [ex for d in picks for ex in warmup_examples(d, tok, evaluator.env(d.task_name))]
            return [c for c, _ in examples], [t for _, t in examples]

        def evaluate() -> float:
            model.eval()
            _, carry, _ = evaluator.rollout(val, group_size=1, partition_id=None, greedy=True)
            return float(carry["rewards"].mean())

        self.say(f"supervised warm-up (target held-out accuracy {cfg.warmup.target_accuracy})")
        self.warmup_result = supervised_warmup(model, batches, cfg.warmup, evaluate, tok.pad_token_id, self.say)
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    # ---- logging and checkpoints -----------------------------------------------------------------
    def log(self, metrics: dict, step: int) -> None:
        self.logger.log(metrics, step)
        self.last_logged_step = step
        for kind, rows in self.pending_samples:
            self.logger.log_samples(kind, step, rows)
            n = self.cfg.logger.num_val_samples_to_print
            if kind == "validation" and n and rows:
                cols = [c for c in ("prompt", "completion", "ground_truth", "reward") if c in rows[0]]
                where = self.logger.log_dir / "samples.jsonl"
                table = text_table(rows[:n], cols)
                self.say(f"validation samples at step {step} (all {len(rows)} in {where}):\n{table}")
        self.pending_samples.clear()
        self.progress.update(step, metrics)

    def train_samples_due(self) -> bool:
        """Whether the step being run writes its training samples (``logger.log_train_samples_every``)."""
        every = self.cfg.logger.log_train_samples_every
        return bool(every) and (self.last_logged_step + 1) % every == 0

    def checkpoint_due(self, step: int) -> bool:
        ck = self.cfg.checkpointing
        return ck.enabled and (step % ck.save_period == 0 or step == self.cfg.loop.max_num_steps)

    def save_checkpoint(self, step: int, metrics: dict) -> Path:
        ranked = {}
        for k, v in metrics.items():
            if k.startswith("validation/"):
                ranked["val:" + k.split("/", 1)[1]] = v
            elif k.startswith("train/"):
                ranked["train:" + k.split("/", 1)[1]] = v
        info = {
            "step": step,
            "metrics": ranked,
            "initial_validation": self.initial_validation,
            "warmup": self.warmup_result,
        }

        def write(tmp: Path) -> None:
            (tmp / "config.yaml").write_text(dump_config(self.cfg))
            self.policy.run("save", str(tmp / "policy"))
            if self.value is not None:
                self.value.run("save", str(tmp / "value"))
            torch.save(self.train_loader.state_dict(), tmp / "dataloader.pt")
            torch.save({"torch": torch.get_rng_state(), "rollout": self.rollout("rng_state")}, tmp / "rng.pt")
            for name, state in self.checkpoint_parts.items():
                torch.save(state(), tmp / name)

        return self.ckpt.save(step, info, write)

    def summary(self, last_val: dict) -> dict:
        out = {
            "run_dir": str(self.run_dir),
            "warmup": self.warmup_result,
            "accuracy_before": self.initial_validation.get("validation/accuracy"),
            "accuracy_after": last_val.get("validation/accuracy"),
            "wall_seconds": time.perf_counter() - self._t_start,
        }
        (self.run_dir / "summary.json").write_text(json.dumps(out, indent=2))
        return out

    def close(self) -> None:
        for stop in self.closers:
            stop()
        self.closers.clear()
        self.progress.close()
        self.logger.close()
        if isinstance(self.policy, RayGroup):
            import ray

            self.policy.kill()
            if self.value is not None:
                self.value.kill()
            ray.kill(self.rollout_worker)  # the actor's processes (and its envs' workers) go with it
        elif self.rollout_worker is not None:
            self.rollout_worker.close()
        self.data_plane.close()


def build_session(cfg: RunConfig, quiet: bool = False) -> Session:
    return Session(cfg, quiet=quiet)

