"""A training session: the named parts a recipe composes, built in the order they are needed.

    s = Session(cfg)           prompts, data plane, workers (not started), refit, checkpoints, log
    start = s.start()          resume, or warm up and start the workers; validate
    ... the recipe's steps ...
    s.end_step(step, metrics)  validate when due, log, checkpoint when due
    s.summary(); s.close()     (or ``with``)

Each part gets its own config section, or the values it needs.
"""

from __future__ import annotations

import functools
import gc
import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from transformers.utils import logging as hf_logging

from rlplane.config.data import task_names_of
from rlplane.config.loading import dump_config
from rlplane.config.plan import data_plane_index
from rlplane.config.schema import RunConfig
from rlplane.dataplane import make_data_plane
from rlplane.envs.user import EnvErrorWindow, UserTaskError, check_user_tasks, user_task_error_in
from rlplane.errors import WorkerFailed
from rlplane.fast.heap import freeze_heap
from rlplane.fast.switches import check_switches
from rlplane.fast.threads import set_worker_threads
from rlplane.models.configured import load_configured_policy
from rlplane.models.precision import precision_of
from rlplane.runtime import interrupts, watchdog
from rlplane.runtime.deadlines import DeadlineExceeded, call_with_deadline
from rlplane.runtime.groups import init_ray
from rlplane.runtime.shared_paths import node_path_error_in, remove_probes, with_driver_model_path, write_probes
from rlplane.training.checkpoints import Checkpoints
from rlplane.training.components import Components, DataPlanePolicy, LoggerSink
from rlplane.training.early_stop import EarlyStop
from rlplane.training.loop import validate
from rlplane.training.numerics import keep_recorded_precision, settle_precision
from rlplane.training.prompts import Prompts
from rlplane.training.refit import Refit
from rlplane.training.runlog import RunLog
from rlplane.training.warmup import warm_up
from rlplane.training.workers import (
    Workers,
    check_gdpo_components,
    check_placement,
    check_ray_resources,
    env_pool_specs,
)
from rlplane.utils.checkpoint import latest_checkpoint
from rlplane.utils.kill_points import check_kill_spec, kill_point
from rlplane.utils.run_dir import prepare_run_paths, release_run_dir
from rlplane.utils.seeding import seed_everything


def _user_call(timeout_s: float | None, fn: Callable, what: str):
    """A start-up call into user code under ``env.step_timeout_s``: one that blocks is the user's error."""
    try:
        return call_with_deadline(fn, timeout_s, what, "env.step_timeout_s")
    except DeadlineExceeded as e:
        raise UserTaskError(str(e)) from None


class Session:
    """``critic``: train a value model; ``teacher_cfg``: a frozen teacher's run config (``teacher_logprobs``);
    ``components``: parts given as objects (:mod:`rlplane.training.components`)."""

    def __init__(self, cfg: RunConfig, quiet: bool = False, *, critic: bool = False,
                 teacher_cfg: RunConfig | None = None, components: Components | None = None):
        self.cfg = cfg
        self.components = components or Components()
        # Run paths absolute, writable, no earlier run unless resuming: checked first.
        check_switches()
        check_kill_spec()
        self.paths = prepare_run_paths(cfg)
        self.run_dir = self.paths.run_dir
        self._holds_run_dir = True
        try:
            self._set_up(cfg, quiet, critic, teacher_cfg)
        except BaseException:  # a session that failed to start gives run_dir back, as close() does
            release_run_dir(self.run_dir)
            self._holds_run_dir = False
            raise

    def _set_up(self, cfg: RunConfig, quiet: bool, critic: bool, teacher_cfg: RunConfig | None) -> None:
        c = self.components
        hf_logging.disable_progress_bar()  # the run prints its own progress; no bar per checkpoint write
        set_worker_threads(cfg.policy.threads_per_worker)
        seed_everything(cfg.loop.seed)
        self._t_start = time.perf_counter()
        self._early_messages: list[str] = []  # said once the log exists
        # Tokenizer, checkpoint, data and user tasks first: their errors surface before anything slow.
        # policy.precision: auto -> one concrete choice for config.yaml, checkpoints and every worker: the one a
        # resumed run recorded, else what the policy gets on this host.
        resuming = latest_checkpoint(self.paths.checkpoint_dir) if cfg.checkpointing.resume else None
        cfg, note = keep_recorded_precision(cfg, resuming)
        if note is not None:
            print(note, flush=True)  # beside the choice loading announces for a fresh run
        model, self.tokenizer = load_configured_policy(cfg.policy, cfg.loop.seed)
        cfg = self.cfg = settle_precision(cfg, precision_of(model))
        self.workers = self.shared_paths = None
        self._frozen = False  # gc.freeze() done by start() (and the first begin_step), undone by close()
        self._stepped = False
        p = cfg.policy
        self.checkpoints = c.use("checkpointer", Checkpoints(cfg.checkpointing, self.paths.checkpoint_dir,
                                       max_num_steps=cfg.loop.max_num_steps, config_yaml=dump_config(cfg),
                                       run_config=cfg.model_dump(mode="json"),
                                       dp_size=p.dp_size, fsdp=p.dtensor_cfg.enabled))
        self._resume_from = (self.checkpoints.check_resume(model, self._early_messages.append)
                             if cfg.checkpointing.resume else None)
        del model
        self.prompts = Prompts(cfg.dataset_options(), self.tokenizer, dataset=c.dataset, dataloader=c.dataloader,
                               val_dataset=c.val_dataset)
        self.env_errors = EnvErrorWindow(cfg.env.max_error_rate, cfg.env.error_window_steps)
        self.early_stop = EarlyStop(cfg.loop, cfg.early_stop)
        self.stopped: tuple[int, str] | None = None  # (steps done, why) once a validation ended the run
        self.watchdog = watchdog.Watchdog(cfg.loop.watchdog_s, f"{cfg.algorithm}.watchdog_s",
                                          self.paths.log_dir / "stacks.txt")
        check_user_tasks(cfg.env, [*self.prompts.val_datums, *getattr(self.prompts.dataset, "datums", [])],
                         within=functools.partial(_user_call, cfg.env.step_timeout_s))
        check_gdpo_components(cfg, self.task_names())
        self.log = RunLog(cfg.logger, self.paths, max_num_steps=cfg.loop.max_num_steps, algorithm=cfg.algorithm,
                          run_config=cfg.model_dump(mode="json"), quiet=quiet,
                          sinks=[LoggerSink(c.logger)] if c.logger is not None else None)
        for msg in self._early_messages:
            self.say(msg)
        if self.prompts.stats.get("skipped_overlong"):
            self.say(f"skipped {self.prompts.stats['skipped_overlong']} prompts longer than "
                     "policy.max_total_sequence_length")
        if self.prompts.stats.get("zero_loss_overlong"):
            self.say(f"kept {self.prompts.stats['zero_loss_overlong']} prompts longer than "
                     "policy.max_total_sequence_length with loss_multiplier 0, cut to a few tokens "
                     "(data.on_overlong_prompt: zero_loss; skip drops them)")
        if cfg.runtime == "ray" or cfg.data_plane.backend == "ray":
            init_ray(cfg.cluster.num_cpus, cfg.cluster.address, cfg.cluster.gpus_per_node or None,
                     connect_timeout_s=cfg.cluster.connect_timeout_s)
        # Under Ray, one pool of environment actors per environment the data names (none locally).
        pools = env_pool_specs(cfg, self.task_names())
        if cfg.runtime == "ray":
            check_ray_resources(cfg, critic, uses_teacher=teacher_cfg is not None,
                                env_actors=sum(n for _, n in pools.values()))
            check_placement(cfg, critic, uses_teacher=teacher_cfg is not None)
        worker_cfg = cfg
        if cfg.runtime == "ray":
            # Workers may be on other nodes: absolute paths, checked first thing in each worker.
            self.shared_paths = write_probes(self._probed_dirs())
            worker_cfg = with_driver_model_path(cfg)
            teacher_cfg = teacher_cfg and with_driver_model_path(teacher_cfg)
        dp = cfg.data_plane
        index, why = data_plane_index(cfg)
        if dp.backend == "ray" and not quiet:  # on stdout, as policy.precision's choice: stderr is for errors
            print(f"data_plane.index: {dp.index} -> {index} ({why})", flush=True)
        self.data_plane = make_data_plane(dp.backend, **({"index": index} if dp.backend == "ray" else {}))
        self.workers = Workers(worker_cfg, self.data_plane, critic=critic, teacher_cfg=teacher_cfg,
                               shared_paths=self.shared_paths, env_pool_specs=pools)
        self.refit = Refit(self.workers, say=self.say)
        self.checkpoints.attach(self.workers, self.prompts)
        self.initial_validation: dict[str, float] = {}
        self.warmup_result: dict[str, float] = {}
        self.teacher_warmup_result: dict[str, float] = {}
        self.last_validation: dict[str, float] = {}
        self._closers: list[Callable[[], None]] = []
        # Entered around every validation (async GRPO: its collector paused, as NeMo RL).
        self.while_validating: Callable[[], AbstractContextManager] = nullcontext

    def say(self, msg: str) -> None:
        self.log.say(msg)

    @property
    def policy(self):
        """The policy's data-plane calls (:class:`DataPlanePolicy` over the policy ranks, or the given one)."""
        if getattr(self, "_policy", None) is None:
            built = DataPlanePolicy(self.workers.policy, self.cfg.policy.train_global_batch_size)
            self._policy = self.components.use("policy", built)
        return self._policy

    def task_names(self) -> list[str]:
        """The task names of the training and validation rows (the config's, for a procedural dataset)."""
        rows = [*getattr(self.prompts.dataset, "datums", []), *self.prompts.val_datums]
        names = [] if hasattr(self.prompts.dataset, "datums") else task_names_of(self.cfg.data)
        return list(dict.fromkeys([*names, *(d.task_name for d in rows)]))

    def _probed_dirs(self) -> dict:
        """The directories workers write into: the run directory, and the checkpoints wherever they go."""
        dirs = {"run directory": self.paths.run_dir}
        if self.cfg.checkpointing.enabled or self.cfg.checkpointing.resume:
            dirs["checkpoint directory"] = self.paths.checkpoint_dir
        return dirs

    def _start_workers(self, state: dict | None = None, teacher_state: dict | None = None) -> None:
        """Start every worker; under Ray wait for the rollout actor too, so a worker that cannot see the run's files
        stops the run here."""
        try:
            self.workers.start(state, teacher_state)
            # The generators and the policy's data-plane calls: the run's own, or the ones given to rlplane.train.
            self.workers.rollout = self.components.use("policy_generation", self.workers.rollout)
            self._policy = None
            _ = self.policy
            if self.cfg.runtime != "local":
                self.workers.rollout.call("ping")
        except Exception as e:  # Ray's text of an actor's constructor error: its one line, not the trace
            raise node_path_error_in(e) or user_task_error_in(e) or e from None
        if self.cfg.runtime != "local":
            self._write_placement()

    def _write_placement(self) -> None:
        """``logs/placement.json``: the node, placement group and bundles each actor reports, rewritten each start
        (``environments``: each environment pool's actors, node and pid)."""
        groups = {**self.workers.trained_groups(), "generators": self.workers.rollout.group}
        where = {name: g.run("placement") for name, g in groups.items()}
        if self.workers.env_pools:
            where["environments"] = self.workers.env_placement()
        (self.paths.log_dir / "placement.json").write_text(json.dumps(where, indent=1) + "\n")

    # ---- start: resume, or warm up
    def start(self) -> int:
        """Resume (``checkpointing.resume``) or warm up; start the workers; validate if ``val_at_start``.
        Returns the first step."""
        cfg = self.cfg
        latest = self._resume_from
        if latest is not None:
            self._start_workers()
            info = self.checkpoints.restore(latest)
            self.initial_validation = info.get("initial_validation", {})
            self.warmup_result = info.get("warmup", {})
            self.teacher_warmup_result = info.get("teacher_warmup", {})
            self.early_stop.load_state(info.get("early_stop"))
            self.refit.mark_stale()
            self.refit.version = int(info["step"])
            self.log.last_logged_step = int(info["step"])
            self.say(f"resumed from {latest} at step {info['step']}")
            start = int(info["step"])
        else:
            state = None
            if cfg.warmup.enabled:
                state, self.warmup_result = warm_up(cfg, self.prompts, self.say)
            teacher_state, teacher_cfg = None, self.workers.teacher_cfg
            if teacher_cfg is not None and teacher_cfg.warmup.enabled:
                self.say("teacher:")
                teacher_state, self.teacher_warmup_result = warm_up(teacher_cfg, self.prompts, self.say)
            self._start_workers(state, teacher_state)
            if not self.workers.generator_shares_weights:  # the generators built their own weights: push now
                self.refit.mark_stale()
                try:
                    self.refit.if_stale()
                except Exception as e:  # e.g. a user task the actor's node cannot import: one line, not Ray's trace
                    raise user_task_error_in(e) or e from None
            start = 0
        if cfg.checkpointing.resume:
            # The killed stretch's rows past the checkpoint are redone: drop them.
            if dropped := self.log.logger.drop_after(start if latest is not None else -1):
                self.say(f"dropped {dropped} metrics rows logged after the checkpoint (those steps are redone)")
        self.write_config()
        if start == 0 and cfg.loop.val_at_start:
            self.initial_validation = self.validate()
            self.log.log(self.initial_validation, step=0)
            if reason := self.early_stop.observe(self.initial_validation):
                self.stopped = (0, reason)
                self.say(f"{reason}: stopping before the first step")
        self.last_validation = dict(self.initial_validation)
        self._freeze_heap()
        self.watchdog.start()  # from the first step on: start-up and warm-up are not watched
        return start

    def _freeze_heap(self) -> None:
        """Freeze everything alive now out of the cyclic GC's reach until :meth:`close`
        (:func:`~rlplane.fast.heap.freeze_heap`)."""
        freeze_heap()
        self._frozen = True

    def write_config(self) -> None:
        """``run_dir/config.yaml``, written once the run has really started (a failed start leaves none)."""
        (self.run_dir / "config.yaml").write_text(dump_config(self.cfg))

    def begin_step(self, step: int) -> None:
        """Before step ``step``: samples are seeded by (sample key, weight version = step)."""
        if self._frozen and not self._stepped:
            # Once more before the first step, for what the recipe built after start().
            freeze_heap()
        self._stepped = True
        self.refit.version = step
        watchdog.progress()
        self.workers.rollout.call("set_weight_version", step)
        self.prompts.take_step_record()  # what a step that stopped early drew is no step's record

    def validate(self) -> dict[str, float]:
        """``validation/*`` of the current policy (refit first if stale); greedy answers go to samples.jsonl."""
        self.refit.if_stale()
        with self.while_validating():
            metrics, samples = validate(self.cfg.loop, self.workers.rollout, self.prompts.val_datums,
                                        self.data_plane, self.tokenizer)
        self.log.add_samples("validation", samples)
        return {f"validation/{k}": v for k, v in metrics.items()}

    def last_step(self) -> int:
        """The last step: ``max_num_steps``, or sooner when ``max_num_epochs`` run out (NeMo RL's min).

        With dynamic sampling the bound is unknown up front: :class:`~rlplane.training.loop.DataExhausted`.
        """
        g = self.cfg.loop
        if self.stopped is not None:
            return self.stopped[0]
        if g.use_dynamic_sampling:
            return g.max_num_steps
        return min(g.max_num_steps, g.max_num_epochs * len(self.prompts.loader))

    # ---- after each step
    def end_step(self, step: int, metrics: dict[str, float]) -> bool:
        """After step ``step`` (from 0): validate when due, log, checkpoint when due (and at the last step).
        True when a validation ended the run (:mod:`~rlplane.training.early_stop`): the caller stops."""
        g, done, end = self.cfg.loop, step + 1, self.last_step()
        self.refit.version = done  # the weights the step trained serve the next one
        watchdog.progress()
        kill_point("train")
        if g.validates_after(done) or (g.val_at_end and done == end):
            t0 = time.perf_counter()
            self.last_validation = self.validate()
            metrics.update(self.last_validation)
            metrics["timing/validation/total"] = time.perf_counter() - t0
            if done < end and (reason := self.early_stop.observe(self.last_validation)):
                self.stopped = (done, reason)
                self.say(f"{reason}: stopping after step {done}")
                end = done
        metrics.update(self.refit.take_metrics(step))
        self.log.log(metrics, step=done)
        self._say_actor_deaths(done, metrics)
        self.env_errors.check(metrics)  # env.max_error_rate: stop a run whose environments keep failing
        if (record := self.prompts.take_step_record()) is not None:
            self.log.log_prompts(done, record)
        kill_point("logged")  # a checkpoint not written yet: resuming drops the rows and redoes the step
        saved = None
        if self.checkpoints.due(done) or (done == end and self.cfg.checkpointing.enabled):
            saved = self.save_checkpoint(done, metrics)
        if (sig := interrupts.requested()) is not None and done < end:
            self._stop_on_signal(sig, done, metrics, saved)
        return self.stopped is not None

    def _stop_on_signal(self, sig, done: int, metrics: dict, saved: Path | None) -> None:
        """SIGINT / SIGTERM / SIGHUP asked to stop: a checkpoint of step ``done`` (unless just written, or checkpointing
        is off), then the one line (:class:`~rlplane.errors.TrainingInterrupted`)."""
        if saved is None and self.cfg.checkpointing.enabled:
            saved = self.save_checkpoint(done, metrics)
        raise interrupts.stop_message(sig, done, saved)

    def _say_actor_deaths(self, step: int, metrics: dict[str, float]) -> None:
        """One line per environment whose actors died during the step (runtime: ray; Ray restarted them)."""
        for key, deaths in metrics.items():
            if key.endswith("/actor_deaths") and deaths:
                phase, _, task, _ = key.split("/")
                self.say(f"step {step}: {deaths:g} environment actor(s) of {task!r} died during {phase} and were "
                         f"restarted; the samples they held followed {self.cfg.algorithm}.rollout_failure_policy = "
                         f"{self.cfg.loop.rollout_failure_policy} ({phase}/rollout_failures = "
                         f"{metrics.get(f'{phase}/rollout_failures', 0):g}, rollout_retries = "
                         f"{metrics.get(f'{phase}/rollout_retries', 0):g})")

    def stop_early(self, step: int, reason: Exception) -> None:
        """Step ``step`` found the data used up: validate and checkpoint the step before as the last."""
        g, done = self.cfg.loop, step
        self.say(f"{reason}: stopping after step {done}")
        if done == 0:
            return
        if g.val_at_end and not g.validates_after(done):
            self.last_validation = self.validate()
            self.log.log(self.last_validation, step=done)
        if self.cfg.checkpointing.enabled and not self.checkpoints.due(done):
            self.save_checkpoint(done, self.last_validation)

    def save_checkpoint(self, step: int, metrics: dict) -> Path:
        """``step_N`` now (``end_step`` calls it when due); returns its directory."""
        info = {"initial_validation": self.initial_validation, "warmup": self.warmup_result,
                "early_stop": self.early_stop.state()}
        if self.teacher_warmup_result:
            info["teacher_warmup"] = self.teacher_warmup_result
        return self.checkpoints.save(step, metrics, info)

    def summary(self) -> dict:
        out = {
            "run_dir": str(self.run_dir),
            "warmup": self.warmup_result,
            "accuracy_before": self.initial_validation.get("validation/accuracy"),
            "accuracy_after": self.last_validation.get("validation/accuracy"),
            "wall_seconds": time.perf_counter() - self._t_start,
        }
        if self.teacher_warmup_result:
            out["teacher_warmup"] = self.teacher_warmup_result
        if self.stopped is not None:
            out["stopped_early"] = {"after_step": self.stopped[0], "reason": self.stopped[1]}
        (self.run_dir / "summary.json").write_text(json.dumps(out, indent=2))
        return out

    # ---- shutdown
    def on_close(self, stop: Callable[[], None]) -> None:
        """Run ``stop`` first when the session closes (a recipe's own actor: async GRPO's collector)."""
        self._closers.append(stop)

    def close(self) -> None:
        self.watchdog.stop()
        for stop in self._closers:
            stop()
        self._closers.clear()
        self.log.close()
        if self.workers is not None:
            self.workers.close()
            self.data_plane.close()
        remove_probes(self.shared_paths)
        self.shared_paths = None
        if self._frozen:  # what the session held can be collected again (cycles among its objects too)
            gc.unfreeze()
            self._frozen = False
        if self._holds_run_dir:  # the hold prepare_run_paths took
            release_run_dir(self.run_dir)
            self._holds_run_dir = False

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()
        if exc is not None and self.watchdog.verdict:  # the watchdog ended a stuck step: its line, not the interrupt
            raise WorkerFailed(self.watchdog.verdict) from None
