"""The session's checkpoints: when to save, what a checkpoint holds, and restoring one on resume.

A checkpoint (:class:`~rlplane.utils.checkpoint.CheckpointManager`: atomic, best-K) holds the config,
each worker group's weights and optimizer state (``policy/``, ``value/``, ``teacher/``), the prompt
loader's position, the RNG states of the driver and the sampler, and the extra parts a recipe adds
before its loop (:meth:`Checkpoints.add_part`: async GRPO's replay buffer).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from rlplane.config.loading import dump_config
from rlplane.config.schema import RunConfig
from rlplane.training.prompts import Prompts
from rlplane.training.workers import Workers
from rlplane.utils.checkpoint import CheckpointManager


class Checkpoints:
    def __init__(self, cfg: RunConfig, run_dir: Path, workers: Workers, prompts: Prompts):
        ck = cfg.checkpointing
        self.cfg, self.workers, self.prompts = cfg, workers, prompts
        self.manager = CheckpointManager(ck.checkpoint_dir or run_dir / "checkpoints", ck.keep_top_k, ck.metric_name,
                                         ck.higher_is_better)
        self.parts: dict[str, Callable[[], object]] = {}
        self.resumed_from: Path | None = None

    def add_part(self, file_name: str, state: Callable[[], object]) -> None:
        """Keep ``state()`` (written with torch.save) as ``file_name`` in every checkpoint from now on."""
        self.parts[file_name] = state

    def to_resume(self, say: Callable[[str], None]) -> Path | None:
        """The latest complete checkpoint when ``checkpointing.resume`` is on (half-written ones removed)."""
        if not self.cfg.checkpointing.resume:
            return None
        latest = self.manager.latest()
        removed = self.manager.clean_partial()
        if removed:
            say(f"removed incomplete checkpoint(s) {', '.join(removed)}")
        return latest

    def restore(self, path: Path) -> dict:
        """Load ``path`` into the (started) workers, the prompt loader and the RNGs; returns its training info."""
        info = self.manager.load_info(path)
        for name, group in self.workers.trained_groups().items():
            if (path / name).is_dir():
                group.run("load", str(path / name))
        self.prompts.load_state_dict(torch.load(path / "dataloader.pt", weights_only=True))
        rng = torch.load(path / "rng.pt", weights_only=True)
        torch.set_rng_state(rng["torch"])
        self.workers.rollout.call("set_rng_state", rng["rollout"])
        self.resumed_from = path
        return info

    def due(self, step: int) -> bool:
        ck = self.cfg.checkpointing
        return ck.enabled and (step % ck.save_period == 0 or step == self.cfg.loop.max_num_steps)

    def save(self, step: int, metrics: dict, info: dict) -> Path:
        """Write ``step_N`` with ``metrics`` ranked (``val:*``, ``train:*``) and ``info`` in training_info.json."""
        ranked = {}
        for k, v in metrics.items():
            if k.startswith("validation/"):
                ranked["val:" + k.split("/", 1)[1]] = v
            elif k.startswith("train/"):
                ranked["train:" + k.split("/", 1)[1]] = v

        def write(tmp: Path) -> None:
            (tmp / "config.yaml").write_text(dump_config(self.cfg))
            for name, group in self.workers.trained_groups().items():
                group.run("save", str(tmp / name))
            torch.save(self.prompts.state_dict(), tmp / "dataloader.pt")
            torch.save({"torch": torch.get_rng_state(), "rollout": self.workers.rollout.call("rng_state")}, tmp / "rng.pt")
            for name, state in self.parts.items():
                torch.save(state(), tmp / name)

        return self.manager.save(step, {"step": step, "metrics": ranked, **info}, write)
