"""A training session: the parts the run plan names, assembled in the order their errors should surface.

    s = Session(cfg)               tokenizer, checkpoint check, prompts, log; the plan (printed); data plane, workers
    start = s.start()              resume, or warm up and start the workers; validate
    for step in range(start, s.last_step()):
        s.begin_step(step)
        metrics = <algo>_step(s, ...)
        done = s.trained(step)               refit: the trained weights serve the next step
        s.validate_if_due(done, metrics)     validate
        s.log_step(done, metrics)            log
        saved = s.checkpoint_if_due(done, metrics)
        if s.should_stop(done, metrics, saved): break
    s.summary(); s.close()         (or ``with``)

Each part gets its own config section, or its slice of the plan. A recipe's own long-lived part (async GRPO's
collector) is handed to the constructor as a :class:`~rlplane.training.components.SidePart`; the session calls it
at fixed points.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import yaml
from transformers.utils import logging as hf_logging

from rlplane.config.data import task_names_of
from rlplane.config.loading import dump_config
from rlplane.config.schema import RunConfig
from rlplane.dataplane import make_data_plane
from rlplane.envs.user import EnvErrorWindow, UserTaskError, check_user_tasks, user_task_error_in
from rlplane.errors import WorkerFailed
from rlplane.fast.heap import freeze_heap
from rlplane.fast.switches import check_switches
from rlplane.fast.threads import set_worker_threads
from rlplane.models.configured import configured_tokenizer, configured_weight_shapes
from rlplane.models.loading import EMBEDDED_PREFIX
from rlplane.runtime.deadlines import DeadlineExceeded, call_with_deadline
from rlplane.runtime.groups import cluster_gpus, init_ray
from rlplane.runtime.interrupts import StopSignals, stop_message
from rlplane.runtime.shared_paths import node_path_error_in, remove_probes, write_probes
from rlplane.runtime.watchdog import Watchdog
from rlplane.training.checkpoints import Checkpoints
from rlplane.training.components import Components, DataPlanePolicy, LoggerSink, SidePart
from rlplane.training.early_stop import EarlyStop
from rlplane.training.loop import validate
from rlplane.training.numerics import numerics, settle_precision
from rlplane.training.plan import RunPlan, build_plan
from rlplane.training.prompts import Prompts
from rlplane.training.refit import Refit
from rlplane.training.runlog import RunLog, actor_death_lines
from rlplane.training.warmup import warm_up
from rlplane.training.workers import Workers, check_gdpo_components, check_placement, check_ray_resources
from rlplane.utils.checkpoint import latest_checkpoint
from rlplane.utils.kill_points import check_kill_spec, kill_point
from rlplane.utils.run_dir import prepare_run_paths, release_run_dir
from rlplane.utils.seeding import seed_everything

PLAN_FILE = "plan.yaml"  # the run plan, beside config.yaml


def _user_call(timeout_s: float | None, fn: Callable, what: str):
    """A start-up call into user code under ``env.step_timeout_s``: one that blocks is the user's error."""
    try:
        return call_with_deadline(fn, timeout_s, what, "env.step_timeout_s")
    except DeadlineExceeded as e:
        raise UserTaskError(str(e)) from None


class Session:
    """``components``: parts given as objects (:mod:`rlplane.training.components`); ``side``: the recipe's own part
    (:class:`~rlplane.training.components.SidePart`); ``signals``: the stop signals ``rlplane train`` installed
    (None: the run takes none). Which workers run (a critic for PPO with GAE, a teacher for distillation) is the
    run plan's role table. The run's supervision is its own: ``signals`` and ``watchdog``, handed to every worker
    group it makes."""

    def __init__(self, cfg: RunConfig, quiet: bool = False, *, components: Components | None = None,
                 side: SidePart | None = None, signals: StopSignals | None = None):
        self.components = components or Components()
        self.side = side
        self.signals = signals or StopSignals()
        # Run paths absolute, writable, no earlier run unless resuming: checked first.
        check_switches()
        check_kill_spec()
        self.paths = prepare_run_paths(cfg)
        self.run_dir = self.paths.run_dir
        self._holds_run_dir = True
        try:
            self._set_up(cfg, quiet)
        except BaseException:  # a session that failed to start gives run_dir back, as close() does
            release_run_dir(self.run_dir)
            self._holds_run_dir = False
            raise

    def _set_up(self, cfg: RunConfig, quiet: bool) -> None:
        """The session's parts, in the order their errors should surface: the run's numerics and data (tokenizer,
        a checkpoint to resume, prompts, user tasks) before anything slow; the log; the plan, printed; the parts the
        plan names (data plane, workers not started yet, refit)."""
        self._t_start = time.perf_counter()
        self.workers = self.shared_paths = None  # what close() releases, once they exist
        self._frozen = False  # gc.freeze() done by start() (and the first begin_step), undone by close()
        self._stepped = False
        self.stopped: tuple[int, str] | None = None  # (steps done, why) once a validation ended the run
        self.initial_validation: dict[str, float] = {}
        self.warmup_result: dict[str, float] = {}
        self.teacher_warmup_result: dict[str, float] = {}
        self.last_validation: dict[str, float] = {}
        hf_logging.disable_progress_bar()  # the run prints its own progress; no bar per checkpoint write
        # The embedded model's width is in the config; a loaded model's workers set theirs from its config.
        embedded = cfg.policy.model_name.startswith(EMBEDDED_PREFIX)
        set_worker_threads(cfg.policy.threads_per_worker, cfg.policy.tiny.hidden_size if embedded else None)
        seed_everything(cfg.loop.seed)
        # policy.precision: auto -> one concrete choice for config.yaml, checkpoints and every worker: the one a
        # resumed run recorded, else what this host and the model's width give.
        num = numerics(cfg, latest_checkpoint(self.paths.checkpoint_dir) if cfg.checkpointing.resume else None)
        cfg = self.cfg = settle_precision(cfg, num.precision) if num.precision != "auto" else cfg
        said = self._read_data(cfg)
        c = self.components
        self.log = RunLog(cfg.logger, self.paths, max_num_steps=cfg.loop.max_num_steps, algorithm=cfg.algorithm,
                          run_config=cfg.model_dump(mode="json"), quiet=quiet,
                          sinks=[LoggerSink(c.logger)] if c.logger is not None else None)
        for msg in said:
            self.say(msg)
        self.env_errors = EnvErrorWindow(cfg.env.max_error_rate, cfg.env.error_window_steps)
        self.early_stop = EarlyStop(cfg.loop, cfg.early_stop)
        self.watchdog = Watchdog(cfg.loop.watchdog_s, f"{cfg.algorithm}.watchdog_s", self.paths.log_dir / "stacks.txt",
                                 interrupt=self.signals.interrupt_now)
        self.plan = self._make_plan(cfg, num, quiet)
        self._assemble(self.plan, cfg)

    def _read_data(self, cfg: RunConfig) -> list[str]:
        """Tokenizer, the checkpoint to resume (checked against the configured model's weight shapes: no model is
        loaded), the prompts, the user tasks (each stepped once); returns what to say once the log exists."""
        c, side, said = self.components, self.side, []
        self.tokenizer = configured_tokenizer(cfg.policy)
        p = cfg.policy
        self.checkpoints = c.use("checkpointer", Checkpoints(cfg.checkpointing, self.paths.checkpoint_dir,
                                       max_num_steps=cfg.loop.max_num_steps, config_yaml=dump_config(cfg),
                                       run_config=cfg.model_dump(mode="json"),
                                       dp_size=p.dp_size, fsdp=p.dtensor_cfg.enabled))
        self._resume_from = (self.checkpoints.check_resume(
            functools.partial(configured_weight_shapes, p, self.tokenizer), said.append)
            if cfg.checkpointing.resume else None)
        self.prompts = Prompts(cfg.dataset_options(), self.tokenizer, dataset=c.dataset, dataloader=c.dataloader,
                               val_dataset=c.val_dataset, state_from=side.loader_state if side else None)
        check_user_tasks(cfg.env, [*self.prompts.val_datums, *getattr(self.prompts.dataset, "datums", [])],
                         within=functools.partial(_user_call, cfg.env.step_timeout_s))
        check_gdpo_components(cfg, self.task_names())
        stats = self.prompts.stats
        if stats.get("skipped_overlong"):
            said.append(f"skipped {stats['skipped_overlong']} prompts longer than policy.max_total_sequence_length")
        if stats.get("zero_loss_overlong"):
            said.append(f"kept {stats['zero_loss_overlong']} prompts longer than policy.max_total_sequence_length "
                        "with loss_multiplier 0, cut to a few tokens (data.on_overlong_prompt: zero_loss; skip drops "
                        "them)")
        return said

    def _make_plan(self, cfg: RunConfig, num, quiet: bool) -> RunPlan:
        """The run plan from the config, the data read and (``runtime: ray``) the cluster joined; printed."""
        ray = cfg.runtime == "ray"
        if ray or cfg.data_plane.backend == "ray":
            init_ray(cfg.cluster.num_cpus, cfg.cluster.address, cfg.cluster.gpus_per_node or None,
                     connect_timeout_s=cfg.cluster.connect_timeout_s, signals=self.signals)
        per_epoch = None if cfg.loop.use_dynamic_sampling else len(self.prompts.loader)
        plan = build_plan(cfg, steps_per_epoch=per_epoch, task_names=self.task_names(),
                          cluster_gpus=cluster_gpus() if ray else 0.0, settled=num)
        if not quiet:  # on stdout with the other start-up choices (policy.precision's): stderr is for errors
            print(plan.table(self.run_dir / PLAN_FILE), flush=True)
        return plan

    def _assemble(self, plan: RunPlan, cfg: RunConfig) -> None:
        """The parts the plan names: under Ray its actors held against the cluster and the run's paths probed; the
        data plane, the workers (started by :meth:`start`), the refit; the side part's hooks."""
        if plan.runtime == "ray":
            check_ray_resources(plan)
            check_placement(plan, cfg.cluster.num_nodes, cfg.policy.generation.colocated.enabled)
            # Workers may be on other nodes: paths they write to are probed first thing in each worker.
            self.shared_paths = write_probes(self._probed_dirs())
        dp = plan.data_plane
        self.data_plane = make_data_plane(dp.backend, **({"index": dp.index} if dp.backend == "ray" else {}))
        self.workers = Workers(plan, self.data_plane, cfg.env, shared_paths=self.shared_paths,
                               num_nodes=cfg.cluster.num_nodes, watchdog=self.watchdog)
        self.refit = Refit(self.workers, plan.weight_check, sharded=plan.sharded_policy, say=self.say)
        self.checkpoints.attach(self.workers, self.prompts)
        side = self.side
        if side is not None:
            self.checkpoints.add_part(side.checkpoint_file, side.save)
        self._closers: list[Callable[[], None]] = [side.stop] if side is not None else []

    def say(self, msg: str) -> None:
        self.log.say(msg)

    @property
    def policy(self):
        """The policy's data-plane calls (:class:`DataPlanePolicy` over the policy ranks, or the given one)."""
        if getattr(self, "_policy", None) is None:
            built = DataPlanePolicy(self.workers.policy, self.plan.sizes.train_global_batch_size)
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
            if self.plan.runtime != "local":
                self.workers.rollout.ping()
        except Exception as e:  # Ray's text of an actor's constructor error: its one line, not the trace
            raise node_path_error_in(e) or user_task_error_in(e) or e from None
        if self.plan.runtime != "local":
            # logs/placement.json: where each actor runs, rewritten each start.
            where = json.dumps(self.workers.placement(), indent=1)
            (self.paths.log_dir / "placement.json").write_text(where + "\n")

    # ---- start: resume, or warm up
    def start(self) -> int:
        """Resume (``checkpointing.resume``) or warm up; start the workers; validate if ``val_at_start``; start the
        side part. Returns the first step."""
        cfg, plan = self.cfg, self.plan
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
            state = teacher_state = None
            if cfg.warmup.enabled:
                state, self.warmup_result = warm_up(plan.rollout, cfg.warmup, cfg.env, self.prompts, self.say)
            if plan.teacher is not None and plan.teacher.warmup.enabled:
                self.say("teacher:")
                teacher = dataclasses.replace(plan.rollout, policy=plan.teacher.options.policy)
                teacher_state, self.teacher_warmup_result = warm_up(teacher, plan.teacher.warmup, cfg.env,
                                                                    self.prompts, self.say)
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
        if self.side is not None:
            self.side.start(self, start)
        return start

    def _freeze_heap(self) -> None:
        """Freeze everything alive now out of the cyclic GC's reach until :meth:`close`
        (:func:`~rlplane.fast.heap.freeze_heap`)."""
        freeze_heap()
        self._frozen = True

    def write_config(self) -> None:
        """``run_dir/config.yaml`` and the plan beside it (``plan.yaml``), written once the run has really started
        (a failed start leaves neither)."""
        (self.run_dir / "config.yaml").write_text(dump_config(self.cfg))
        (self.run_dir / PLAN_FILE).write_text(yaml.safe_dump(self.plan.to_dict(), sort_keys=False))

    def begin_step(self, step: int) -> None:
        """Before step ``step``: samples are seeded by (sample key, weight version = step)."""
        if self._frozen and not self._stepped:
            # Once more before the first step, for what the recipe built after start().
            freeze_heap()
        self._stepped = True
        self.refit.version = step
        self.watchdog.progress()
        self.workers.rollout.set_weight_version(step)
        self.prompts.take_step_record()  # what a step that stopped early drew is no step's record

    def validate(self) -> dict[str, float]:
        """``validation/*`` of the current policy (refit first if stale); greedy answers go to samples.jsonl.
        The side part (async GRPO's collector) is paused meanwhile, as NeMo RL does."""
        self.refit.if_stale()
        with self.side.paused() if self.side is not None else nullcontext():
            metrics, samples = validate(self.cfg.loop, self.workers.rollout, self.prompts.val_datums,
                                        self.data_plane, self.tokenizer)
        self.log.add_samples("validation", samples)
        return {f"validation/{k}": v for k, v in metrics.items()}

    def last_step(self) -> int:
        """The last step: the plan's (``max_num_steps``, or sooner when ``max_num_epochs`` run out), or the one a
        validation stopped the run at. With dynamic sampling the data may run out sooner:
        :class:`~rlplane.training.loop.DataExhausted`."""
        return self.stopped[0] if self.stopped is not None else self.plan.sizes.last_step

    # ---- the jobs that end a step, in the recipe loop's order
    def trained(self, step: int) -> int:
        """``refit``: step ``step`` trained the policy's weights to version ``step + 1``, which serve the next step
        (a validation's refit now stamps them so). Returns ``step + 1``, the steps done."""
        done = step + 1
        self.refit.trained(done)
        self.watchdog.progress()
        kill_point("train")
        return done

    def validate_if_due(self, done: int, metrics: dict[str, float]) -> None:
        """``validate``: every ``val_period`` steps and at the last, into ``metrics``; a validation can end the run
        (:mod:`~rlplane.training.early_stop`)."""
        g, end = self.cfg.loop, self.last_step()
        if g.validates_after(done) or (g.val_at_end and done == end):
            t0 = time.perf_counter()
            self.last_validation = self.validate()
            metrics.update(self.last_validation)
            metrics["timing/validation/total"] = time.perf_counter() - t0
            if done < end and (reason := self.early_stop.observe(self.last_validation)):
                self.stopped = (done, reason)
                self.say(f"{reason}: stopping after step {done}")

    def log_step(self, done: int, metrics: dict[str, float]) -> None:
        """``log``: the step's row (with the weight-sync checks of the versions it used), a line per environment
        whose actors died, the environments' error rate (``env.max_error_rate``), the step's prompts record."""
        metrics.update(self.refit.take_metrics(done - 1))
        self.log.log(metrics, step=done)
        for line in actor_death_lines(done, metrics, self.cfg.algorithm, self.cfg.loop.rollout_failure_policy):
            self.say(line)
        self.env_errors.check(metrics)  # env.max_error_rate: stop a run whose environments keep failing
        if (record := self.prompts.take_step_record()) is not None:
            self.log.log_prompts(done, record)
        kill_point("logged")  # a checkpoint not written yet: resuming drops the rows and redoes the step

    def checkpoint_if_due(self, done: int, metrics: dict[str, float]) -> Path | None:
        """``checkpoint``: every ``save_period`` steps and at the last (also where a validation stopped the run);
        returns its directory, or None."""
        if self.checkpoints.due(done) or (done == self.last_step() and self.cfg.checkpointing.enabled):
            return self.save_checkpoint(done, metrics)
        return None

    def should_stop(self, done: int, metrics: dict[str, float], saved: Path | None) -> bool:
        """Whether the loop ends after step ``done``: a validation stopped the run, or SIGINT / SIGTERM / SIGHUP
        asked to stop (a checkpoint of the step unless just written or checkpointing is off, then the one line:
        :class:`~rlplane.errors.TrainingInterrupted`)."""
        if (sig := self.signals.requested) is not None and done < self.last_step():
            if saved is None and self.cfg.checkpointing.enabled:
                saved = self.save_checkpoint(done, metrics)
            raise stop_message(sig, done, saved)
        return self.stopped is not None

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
        """``step_N`` now (:meth:`checkpoint_if_due` calls it when due); returns its directory."""
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
        """Run ``stop`` first when the session closes (an actor a test or a user's recipe started beside it)."""
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
