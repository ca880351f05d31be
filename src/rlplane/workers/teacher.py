"""The teacher worker of on-policy distillation: a frozen model scoring the student's tokens over its DP shard (same
tokenizer as the student), as ``teacher_logprobs`` or as its top-k logits per token."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from rlplane.dataplane import DataPlaneClient, KVBatchMeta
from rlplane.dataplane.columns import TEACHER_LOGPROBS, TEACHER_TOPK_INDICES, TEACHER_TOPK_LOGITS
from rlplane.models.configured import load_configured_policy
from rlplane.runtime.shared_paths import SharedPaths
from rlplane.workers import rank as rank_block
from rlplane.workers.rank import DPRank
from rlplane.workers.scorer import Scorer, shard_topk_logits

if TYPE_CHECKING:
    from rlplane.config.policy import PolicyConfig


@dataclass(frozen=True)
class TeacherWorkerOptions:
    """What a teacher rank takes from the run's config (the run plan builds it: ``training/plan.py``)."""

    policy: PolicyConfig  # the teacher's ``policy`` section: its model, micro-batching, sampling, device
    seed: int  # the run's seed: the embedded model's initialisation


class TeacherWorker:
    """One data-parallel rank of the frozen teacher: ``compute_logprobs`` only."""

    def __init__(
        self,
        options: TeacherWorkerOptions,
        data_plane: DataPlaneClient | None,
        rank: int = 0,
        world_size: int = 1,
        init_state: dict[str, torch.Tensor] | None = None,
        shared_paths: SharedPaths | None = None,
    ):
        p = options.policy
        self.dp_rank = DPRank("teacher worker", p, data_plane, rank, world_size, shared_paths)
        model, self.tokenizer = load_configured_policy(p, options.seed, init_state=init_state)
        # Filtered like the student's prev logprobs: the same sampling distribution on both sides.
        self.scorer = Scorer(model, self.dp_rank, p, self.tokenizer.pad_token_id or 0, filtered=True)

    @property
    def model(self) -> torch.nn.Module:
        return self.scorer.model

    def ping(self) -> int:
        return self.dp_rank.rank

    def placement(self) -> dict:
        return rank_block.placement()

    def compute_logprobs(self, meta: KVBatchMeta, out_field: str = TEACHER_LOGPROBS) -> KVBatchMeta | None:
        """Forward the shard without gradients and write the teacher's per-token logprobs back as ``out_field``."""
        return self.scorer.write_logprobs(meta, out_field)

    def compute_topk_logits(self, meta: KVBatchMeta, k: int) -> KVBatchMeta | None:
        """The teacher's ``k`` largest logits of each token and their ids, written back as ``teacher_topk_logits``
        and ``teacher_topk_indices`` (the top-k KL's input; :func:`~rlplane.workers.scorer.shard_topk_logits`)."""
        return shard_topk_logits(self.dp_rank, self.model, meta, (TEACHER_TOPK_LOGITS, TEACHER_TOPK_INDICES),
                                 self.scorer.policy, k)

    def save(self, path: str) -> None:
        """HF weights + tokenizer to ``path/weights`` (rank 0): the warmed-up teacher survives a resume."""
        if self.dp_rank.rank == 0:
            self.model.save_pretrained(os.path.join(path, "weights"), safe_serialization=True)
            self.tokenizer.save_pretrained(os.path.join(path, "weights"))

    def load(self, path: str) -> None:
        from rlplane.utils.checkpoint import check_weights_fit, load_weights

        weights_dir = os.path.join(path, "weights")
        check_weights_fit(self.model, weights_dir, "resume with the run's own teacher settings (its config.yaml)")
        self.model.load_state_dict(load_weights(weights_dir), strict=False)  # a tied lm_head is saved once
