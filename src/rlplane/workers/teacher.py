"""The teacher worker of on-policy distillation: a second policy, frozen, with its own model.

It computes ``teacher_logprobs`` (log π_teacher of each token the student generated, same
convention and temperature as the policy's logprobs) over its data-parallel shard and writes them
back into the data plane; it never trains. Its config is the run's with ``policy`` naming the
teacher's model (:func:`rlplane.recipes.distillation.teacher_config`); it must share the student's
tokenizer, since it scores the student's token ids.
"""

from __future__ import annotations

import os

import torch

from rlplane.config.schema import RunConfig
from rlplane.dataplane import DataPlaneClient
from rlplane.dataplane.columns import TEACHER_LOGPROBS
from rlplane.runtime.shared_paths import SharedPaths
from rlplane.workers.base import load_configured_policy
from rlplane.workers.policy import PolicyWorker


class TeacherWorker(PolicyWorker):
    """One data-parallel rank of the frozen teacher: ``compute_logprobs`` (inherited) only."""

    def __init__(
        self,
        cfg: RunConfig,
        data_plane: DataPlaneClient | None,
        rank: int = 0,
        world_size: int = 1,
        init_state: dict[str, torch.Tensor] | None = None,
        shared_paths: SharedPaths | None = None,
    ):
        self._start("teacher worker", cfg, data_plane, rank, world_size, shared_paths)
        self.model, self.tokenizer = load_configured_policy(cfg, init_state=init_state)
        self.model.to(self.device).eval().requires_grad_(False)
        self.reference = None
        self.group = None

    def compute_logprobs(self, meta, out_field: str = TEACHER_LOGPROBS, reference: bool = False) -> None:
        return super().compute_logprobs(meta, out_field=out_field)

    def train(self, *args, **kwargs):
        raise RuntimeError("the teacher is frozen: it computes teacher_logprobs and never trains")

    def save(self, path: str) -> None:
        """HF weights + tokenizer to ``path/weights`` (rank 0): the warmed-up teacher survives a resume."""
        if self.rank == 0:
            self.model.save_pretrained(os.path.join(path, "weights"), safe_serialization=True)
            self.tokenizer.save_pretrained(os.path.join(path, "weights"))

    def load(self, path: str) -> None:
        from rlplane.utils.checkpoint import check_weights_fit, load_weights

        weights_dir = os.path.join(path, "weights")
        check_weights_fit(self.model, weights_dir, "resume with the run's own teacher settings (its config.yaml)")
        self.model.load_state_dict(load_weights(weights_dir), strict=False)  # a tied lm_head is saved once
