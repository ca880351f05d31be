"""The session's checkpoints: when to save, what one holds (config, worker groups' weights and optimizers,
loader position, RNGs, recipe parts such as the replay buffer), and restoring one on resume."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from rlplane.config.resume import check_checkpoint_config
from rlplane.config.schema import CheckpointingConfig
from rlplane.errors import ConfigError
from rlplane.training.prompts import Prompts
from rlplane.training.workers import Workers
from rlplane.utils.checkpoint import (
    CheckpointError,
    CheckpointManager,
    check_shapes_fit,
    load_torch_state,
    weight_shapes,
)
from rlplane.utils.kill_points import kill_point
from rlplane.workers.parallel import LAYOUT_FILE, check_resume_layout


class Checkpoints:
    """``config_yaml`` / ``run_config``: the run's config as text (saved) and plain data (checked on resume);
    ``dp_size`` and ``fsdp``: the policy layout a checkpoint to resume must share."""

    def __init__(self, checkpointing: CheckpointingConfig, checkpoint_dir: Path, *, max_num_steps: int,
                 config_yaml: str, run_config: dict, dp_size: int, fsdp: bool):
        ck = self.options = checkpointing
        self.max_num_steps, self.config_yaml, self.dp_size, self.fsdp = max_num_steps, config_yaml, dp_size, fsdp
        self.run_config = run_config
        self.manager = CheckpointManager(checkpoint_dir, ck.keep_top_k, ck.metric_name, ck.higher_is_better)
        self.workers: Workers | None = None
        self.prompts: Prompts | None = None
        self.parts: dict[str, Callable[[Path], None]] = {}
        self.resumed_from: Path | None = None
        self._resume_state: dict = {}

    def attach(self, workers: Workers, prompts: Prompts) -> None:
        """What a checkpoint holds: the workers' groups, the prompt loader (set once they exist)."""
        self.workers, self.prompts = workers, prompts

    def add_part(self, file_name: str, save: Callable[[Path], None]) -> None:
        """Have ``save(path)`` write ``file_name`` in every checkpoint from now on (the part's owner writes it)."""
        self.parts[file_name] = save

    def check_resume(self, weight_shapes_now: Callable[[], dict[str, tuple[int, ...]]],
                     say: Callable[[str], None]) -> Path | None:
        """Repair a crash mid-save, then check the latest checkpoint (info, files, weight shapes against
        ``weight_shapes_now()``: the configured policy's) so damage is a one-line error before any worker starts.
        Returns it (or None)."""
        for what in self.manager.repair():
            say(f"checkpoint {what}")
        latest = self.manager.latest()
        if latest is None:
            say(f"checkpointing.resume=true: no checkpoint in {self.manager.dir} to resume; starting a fresh run")
            return None
        self.manager.load_info(latest)
        check_resume_layout(str(latest / "policy"), self.dp_size, self.fsdp)
        sharded = (latest / "policy" / LAYOUT_FILE).is_file()  # FSDP: optimizer state in sharded/, no optimizer.pt
        if not sharded and not (latest / "policy" / "optimizer.pt").is_file():
            raise CheckpointError(f"checkpoint {latest}: policy/optimizer.pt is missing (an incomplete checkpoint); "
                                  f"delete {latest} to resume from the one before")
        # Small: read now, so damage is an error before any worker starts.
        self._resume_state = {"dataloader": load_torch_state(latest / "dataloader.pt"),
                              "rng": load_torch_state(latest / "rng.pt")}
        # Every changed key is free, converted or refused, one line each.
        check, lines = check_checkpoint_config(latest, self.run_config,
                                               self._resume_state["dataloader"])
        if check.refusals:
            raise ConfigError(check.refusals)
        for line in lines:
            say(line)
        fix = ("resume with the policy settings of the run that wrote "
               f"it ({latest / 'config.yaml'}), or start a new run_dir")
        check_shapes_fit(weight_shapes_now(), latest / "policy" / "weights", fix)
        for name in ("value", "teacher"):
            if (latest / name / "weights").is_dir():
                weight_shapes(latest / name / "weights")  # damaged or truncated: say so now
        return latest

    def restore(self, path: Path) -> dict:
        """Load ``path`` into the started workers, the prompt loader and the RNGs; returns its training info."""
        info = self.manager.load_info(path)
        for name, group in self.workers.trained_groups().items():
            if (path / name).is_dir():
                group.run(group.cls.load, str(path / name))
                if name in ("policy", "value"):  # loading restored the saved lr etc.: this run's apply
                    group.run(group.cls.apply_optimizer_settings, **self.run_config[name]["optimizer"])
        self.prompts.load_state_dict(self._resume_state["dataloader"])
        rng = self._resume_state["rng"]
        torch.set_rng_state(rng["torch"])
        self.workers.rollout.set_rng_state(rng["rollout"])
        self.resumed_from = path
        return info

    def due(self, step: int) -> bool:
        ck = self.options
        return ck.enabled and (step % ck.save_period == 0 or step == self.max_num_steps)

    def save(self, step: int, metrics: dict, info: dict) -> Path:
        """Write ``step_N`` with ``metrics`` ranked (``val:*``, ``train:*``) and ``info`` in training_info.json."""
        ranked = {}
        for k, v in metrics.items():
            if k.startswith("validation/"):
                ranked["val:" + k.split("/", 1)[1]] = v
            elif k.startswith("train/"):
                ranked["train:" + k.split("/", 1)[1]] = v

        def write(tmp: Path) -> None:
            (tmp / "config.yaml").write_text(self.config_yaml)
            for name, group in self.workers.trained_groups().items():
                group.run(group.cls.save, str(tmp / name))
            kill_point("checkpoint_write")
            torch.save(self.prompts.state_dict(), tmp / "dataloader.pt")
            torch.save({"torch": torch.get_rng_state(), "rollout": self.workers.rollout.rng_state()},
                       tmp / "rng.pt")
            for name, save in self.parts.items():
                save(tmp / name)

        return self.manager.save(step, {"step": step, "metrics": ranked, **info}, write)
