"""A training session: the named parts a recipe composes, built in the order they are needed.

    s = Session(cfg)           prompts (data errors surface before anything slow), data plane,
                               workers (not started yet), refit, checkpoints, log
    start = s.start()          resume from a checkpoint, or warm up and start the workers; validate
    ... the recipe's steps ...    s.workers / s.refit / s.data_plane / s.prompts, then per step:
    s.end_step(step, metrics)  validate when due, log, checkpoint when due
    s.summary()                the run's before/after figures; s.close() (or ``with``) stops everything

Each part has one job: :class:`Prompts` (data), :class:`Workers` (actors, through the runtime
layer), :class:`Refit` (generator weights), :class:`Checkpoints` (save / restore), :class:`RunLog`
(console, progress, metric sinks and trackers, sample tables: ``s.log``), :func:`warm_up` (the
supervised warm-up). The session holds the run config; each part gets its own section (or the
values it needs) from it.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from rlplane.config.loading import dump_config
from rlplane.config.plan import data_plane_index
from rlplane.config.schema import RunConfig
from rlplane.dataplane import make_data_plane
from rlplane.envs.user import EnvErrorWindow, check_user_tasks, user_task_error_in
from rlplane.fast.heap import freeze_heap
from rlplane.fast.threads import set_worker_threads
from rlplane.models.configured import load_configured_policy
from rlplane.runtime.groups import init_ray
from rlplane.runtime.shared_paths import node_path_error_in, remove_probes, with_driver_model_path, write_probes
from rlplane.training.checkpoints import Checkpoints
from rlplane.training.loop import validate
from rlplane.training.prompts import Prompts
from rlplane.training.refit import Refit
from rlplane.training.runlog import RunLog
from rlplane.training.warmup import warm_up
from rlplane.training.workers import Workers, check_placement, check_ray_resources
from rlplane.utils.kill_points import kill_point
from rlplane.utils.run_dir import prepare_run_paths, release_run_dir
from rlplane.utils.seeding import seed_everything


class Session:
    """``critic``: the recipe trains a value model; ``teacher_cfg``: the run config of a frozen teacher
    (its own model and warm-up) whose worker group the recipe reads ``teacher_logprobs`` from."""

    def __init__(self, cfg: RunConfig, quiet: bool = False, *, critic: bool = False,
                 teacher_cfg: RunConfig | None = None):
        self.cfg = cfg
        # Absolute, created and writable, and no earlier run there unless resuming: checked first.
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
        set_worker_threads(cfg.policy.threads_per_worker)
        seed_everything(cfg.loop.seed)
        self._t_start = time.perf_counter()
        self._early_messages: list[str] = []  # said once the log exists
        # Tokenizer, the checkpoint to resume, data and user tasks first: their errors surface before
        # anything slow starts (or any log file is written).
        model, self.tokenizer = load_configured_policy(cfg.policy, cfg.loop.seed)
        self.workers = self.shared_paths = None
        self._frozen = False  # gc.freeze() done by start() (and the first begin_step), undone by close()
        self._stepped = False
        p = cfg.policy
        self.checkpoints = Checkpoints(cfg.checkpointing, self.paths.checkpoint_dir,
                                       max_num_steps=cfg.loop.max_num_steps, config_yaml=dump_config(cfg),
                                       run_config=cfg.model_dump(mode="json"),
                                       dp_size=p.dp_size, fsdp=p.dtensor_cfg.enabled)
        self._resume_from = (self.checkpoints.check_resume(model, self._early_messages.append)
                             if cfg.checkpointing.resume else None)
        del model
        self.prompts = Prompts(cfg.dataset_options(), self.tokenizer)
        self.env_errors = EnvErrorWindow(cfg.env.max_error_rate, cfg.env.error_window_steps)
        check_user_tasks(cfg.env, [*self.prompts.val_datums, *getattr(self.prompts.dataset, "datums", [])])
        self.log = RunLog(cfg.logger, self.paths, max_num_steps=cfg.loop.max_num_steps, algorithm=cfg.algorithm,
                          run_config=cfg.model_dump(mode="json"), quiet=quiet)
        for msg in self._early_messages:
            self.say(msg)
        if self.prompts.stats.get("skipped_overlong"):
            self.say(f"skipped {self.prompts.stats['skipped_overlong']} prompts longer than "
                     "policy.max_total_sequence_length")
        if cfg.runtime == "ray" or cfg.data_plane.backend == "ray":
            init_ray(cfg.cluster.num_cpus, cfg.cluster.address, cfg.cluster.gpus_per_node or None)
        if cfg.runtime == "ray":
            check_ray_resources(cfg, critic, uses_teacher=teacher_cfg is not None)
            check_placement(cfg, critic, uses_teacher=teacher_cfg is not None)
        worker_cfg = cfg
        if cfg.runtime == "ray":
            # Workers may run on other nodes: they get absolute paths (a local model directory resolved
            # here, the run's directories already are) and first check that they see what the driver wrote.
            self.shared_paths = write_probes(self._probed_dirs())
            worker_cfg = with_driver_model_path(cfg)
            teacher_cfg = teacher_cfg and with_driver_model_path(teacher_cfg)
        dp = cfg.data_plane
        index, why = data_plane_index(cfg)
        if dp.backend == "ray" and not quiet:  # on stdout, as policy.precision's choice: stderr is for errors
            print(f"data_plane.index: {dp.index} -> {index} ({why})", flush=True)
        self.data_plane = make_data_plane(dp.backend, **({"index": index} if dp.backend == "ray" else {}))
        self.workers = Workers(worker_cfg, self.data_plane, critic=critic, teacher_cfg=teacher_cfg,
                               shared_paths=self.shared_paths)
        self.refit = Refit(self.workers)
        self.checkpoints.attach(self.workers, self.prompts)
        self.initial_validation: dict[str, float] = {}
        self.warmup_result: dict[str, float] = {}
        self.teacher_warmup_result: dict[str, float] = {}
        self.last_validation: dict[str, float] = {}
        self._closers: list[Callable[[], None]] = []
        # Entered around every validation (async GRPO: its collector paused; NeMo RL pauses generation too).
        self.while_validating: Callable[[], AbstractContextManager] = nullcontext

    def say(self, msg: str) -> None:
        self.log.say(msg)

    def _probed_dirs(self) -> dict:
        """The directories workers write into: the run directory, and the checkpoints wherever they go."""
        dirs = {"run directory": self.paths.run_dir}
        if self.cfg.checkpointing.enabled or self.cfg.checkpointing.resume:
            dirs["checkpoint directory"] = self.paths.checkpoint_dir
        return dirs

    def _start_workers(self, state: dict | None = None, teacher_state: dict | None = None) -> None:
        """Start every worker; under Ray, wait for the rollout actor too (a single actor is not awaited
        when made), so a worker that cannot see the run's files stops the run here, in one line."""
        try:
            self.workers.start(state, teacher_state)
            if self.cfg.runtime != "local":
                self.workers.rollout.call("ping")
        except Exception as e:  # Ray's text of an actor's constructor error: its one line, not the trace
            raise node_path_error_in(e) or user_task_error_in(e) or e from None
        if self.cfg.runtime != "local":
            self._write_placement()

    def _write_placement(self) -> None:
        """``logs/placement.json``: the node, placement group and bundles each actor reports from inside
        itself (worker group → one entry per rank / generator), rewritten at every start: where this
        attempt of the run actually ran, e.g. that split generators got nodes of their own."""
        groups = {**self.workers.trained_groups(), "generators": self.workers.rollout.group}
        where = {name: g.run("placement") for name, g in groups.items()}
        (self.paths.log_dir / "placement.json").write_text(json.dumps(where, indent=1) + "\n")

    # ---- start: resume, or warm up -----------------------------------------------------------------
    def start(self) -> int:
        """Resume from the latest checkpoint (``checkpointing.resume``) or warm up; start the workers;
        validate before the first step (``val_at_start``). Returns the step to start from."""
        cfg = self.cfg
        latest = self._resume_from
        if latest is not None:
            self._start_workers()
            info = self.checkpoints.restore(latest)
            self.initial_validation = info.get("initial_validation", {})
            self.warmup_result = info.get("warmup", {})
            self.teacher_warmup_result = info.get("teacher_warmup", {})
            self.refit.mark_stale()
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
            # The killed stretch's rows (past the checkpoint) are redone: drop them; with nothing to
            # resume the run starts over and keeps none.
            if dropped := self.log.logger.drop_after(start if latest is not None else -1):
                self.say(f"dropped {dropped} metrics rows logged after the checkpoint (those steps are redone)")
        self.write_config()
        if start == 0 and cfg.loop.val_at_start:
            self.initial_validation = self.validate()
            self.log.log(self.initial_validation, step=0)
        self.last_validation = dict(self.initial_validation)
        self._freeze_heap()
        return start

    def _freeze_heap(self) -> None:
        """Move everything alive now (modules, models, datasets: millions of objects) out of the cyclic
        garbage collector's reach until :meth:`close` (:func:`~rlplane.fast.heap.freeze_heap`): a full
        collection would otherwise walk all of it every few steps."""
        freeze_heap()
        self._frozen = True

    def write_config(self) -> None:
        """``run_dir/config.yaml``: written once the run has really started (a run that failed its
        checks leaves none, so running it again is not refused as an earlier run)."""
        (self.run_dir / "config.yaml").write_text(dump_config(self.cfg))

    def begin_step(self, step: int) -> None:
        """Before step ``step``: samples are seeded by (sample key, weight version = step)."""
        if self._frozen and not self._stepped:
            # Once more before the first step, so that what the recipe built after start() (async GRPO's collector
            # thread: its model copy, tokenizer, environments) leaves full collections too.
            freeze_heap()
        self._stepped = True
        self.workers.rollout.call("set_weight_version", step)
        self.prompts.take_step_record()  # what a step that stopped early drew is no step's record

    def validate(self) -> dict[str, float]:
        """``validation/*`` of the current policy (the generator is refit first if stale); the greedy
        answers go to samples.jsonl with the next log."""
        self.refit.if_stale()
        with self.while_validating():
            metrics, samples = validate(self.cfg.loop, self.workers.rollout, self.prompts.val_datums,
                                        self.data_plane)
        self.log.add_samples("validation", samples)
        return {f"validation/{k}": v for k, v in metrics.items()}

    def last_step(self) -> int:
        """The step the run ends at: ``max_num_steps``, or sooner when ``max_num_epochs`` passes over the
        prompts run out first (NeMo RL: ``min(max_num_steps, max_num_epochs · batches per epoch)``).

        Without dynamic sampling each step draws exactly one batch, so the bound is known up front; with
        it a step draws a varying number of batches and :func:`~rlplane.training.rollouts.collect_rollouts`
        raises :class:`~rlplane.training.loop.DataExhausted` when the data runs out (then :meth:`stop_early`).
        """
        g = self.cfg.loop
        if g.use_dynamic_sampling:
            return g.max_num_steps
        return min(g.max_num_steps, g.max_num_epochs * len(self.prompts.loader))

    # ---- after each step ---------------------------------------------------------------------------
    def end_step(self, step: int, metrics: dict[str, float]) -> None:
        """After step ``step`` (from 0): validate when due, log, checkpoint when due (and at the last step)."""
        g, done, end = self.cfg.loop, step + 1, self.last_step()
        kill_point("train")
        if (g.val_period and done % g.val_period == 0) or (g.val_at_end and done == end):
            t0 = time.perf_counter()
            self.last_validation = self.validate()
            metrics.update(self.last_validation)
            metrics["timing/validation/total"] = time.perf_counter() - t0
        self.log.log(metrics, step=done)
        self.env_errors.check(metrics)  # env.max_error_rate: stop a run whose environments keep failing
        if (record := self.prompts.take_step_record()) is not None:
            self.log.log_prompts(done, record)
        kill_point("logged")  # a checkpoint not written yet: resuming drops the rows and redoes the step
        if self.checkpoints.due(done) or (done == end and self.cfg.checkpointing.enabled):
            self.save_checkpoint(done, metrics)

    def stop_early(self, step: int, reason: Exception) -> None:
        """Step ``step`` found the data used up (``max_num_epochs``, dynamic sampling): the end-of-run
        validation and checkpoint of the step before, which did not know it was the last."""
        g, done = self.cfg.loop, step
        self.say(f"{reason}: stopping after step {done}")
        if done == 0:
            return
        if g.val_at_end and not (g.val_period and done % g.val_period == 0):
            self.last_validation = self.validate()
            self.log.log(self.last_validation, step=done)
        if self.cfg.checkpointing.enabled and not self.checkpoints.due(done):
            self.save_checkpoint(done, self.last_validation)

    def save_checkpoint(self, step: int, metrics: dict) -> Path:
        """``step_N`` now (``end_step`` calls it when due); returns its directory."""
        info = {"initial_validation": self.initial_validation, "warmup": self.warmup_result}
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
        (self.run_dir / "summary.json").write_text(json.dumps(out, indent=2))
        return out

    # ---- shutdown ----------------------------------------------------------------------------------
    def on_close(self, stop: Callable[[], None]) -> None:
        """Run ``stop`` first when the session closes (a recipe's own actor: async GRPO's collector)."""
        self._closers.append(stop)

    def close(self) -> None:
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

    def __exit__(self, *exc) -> None:
        self.close()
