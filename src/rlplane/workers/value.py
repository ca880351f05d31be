"""The value worker (PPO critic): the policy's architecture with a scalar head, on its DP shard.

``AutoModelForTokenClassification`` (``num_labels = 1``) from the policy's config and initial trunk, zero
head (V ≡ 0 at first). ``values[:, t] = V(s_t)``: the head at t − 1 shifted right, ``values[:, 0] = 0``
(as NeMo RL), so GAE and the loss use values, returns and ``token_mask`` unshifted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from rlplane.algorithms.value_loss import value_loss
from rlplane.dataplane import DataPlaneClient, KVBatchMeta
from rlplane.dataplane.columns import INPUT_IDS, RETURNS, TOKEN_MASK, VALUES
from rlplane.models.configured import build_value_model
from rlplane.runtime.shared_paths import SharedPaths
from rlplane.workers import parallel, rank as rank_block
from rlplane.workers.packing import MicroBatch, forward_microbatch, microbatch_planner, pad_columns
from rlplane.workers.rank import DPRank
from rlplane.workers.trainer import Trainer

if TYPE_CHECKING:
    from rlplane.config.policy import PolicyConfig
    from rlplane.config.schema import ValueConfig


@dataclass(frozen=True)
class CriticLoss:
    """The critic's clipped MSE (``value.loss_fn``) over the stored ``values`` (v_old) and ``returns``."""

    cliprange: float | None
    scale: float

    def __call__(self, values, batch, sample_mask, global_valid_tokens, _global_valid_seqs):
        return value_loss(values, batch[VALUES], batch[RETURNS], batch[TOKEN_MASK], global_valid_tokens,
                          clip_range=self.cliprange, sample_mask=sample_mask, scale=self.scale)


def shifted_values(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) ``V(s_t)``: the scalar head at t − 1 shifted right by one; position 0 is 0."""
    head = model(input_ids=input_ids, attention_mask=attention_mask).logits[..., 0].float()  # (B, T)
    return F.pad(head[:, :-1], (1, 0))


def microbatch_values(model, input_ids: torch.Tensor, lengths: torch.Tensor, mb: MicroBatch, trim: bool):
    """:func:`shifted_values` of micro-batch ``mb`` as (b, T) rows in ``mb.rows`` order."""
    out, _ = forward_microbatch(model, input_ids, lengths, mb, trim)  # (b, L, 1)
    return pad_columns(F.pad(out[..., 0].float()[:, :-1], (1, 0)), input_ids.shape[1])


@dataclass(frozen=True)
class ValueWorkerOptions:
    """What a critic rank takes from the run's config (the run plan builds it: ``training/plan.py``)."""

    policy: PolicyConfig  # the policy's section: the trunk's model, micro-batching, batch size, device
    value: ValueConfig  # the ``value`` section: optimizer, schedule, clipping, loss
    seed: int  # the run's seed: the embedded trunk's and the head's initialisation


class ValueWorker:
    """One data-parallel rank of the critic: ``compute_values`` and ``train`` on its shard."""

    def __init__(
        self,
        options: ValueWorkerOptions,
        data_plane: DataPlaneClient | None,
        rank: int = 0,
        world_size: int = 1,
        init_state: dict[str, torch.Tensor] | None = None,
        shared_paths: SharedPaths | None = None,
    ):
        p, v = self.policy, self.value = options.policy, options.value
        self.dp_rank = DPRank("value worker", p, data_plane, rank, world_size, shared_paths)
        model, self.tokenizer = build_value_model(p, options.seed, init_state)
        self.trainer = Trainer(model, v.optimizer, v.scheduler, self.dp_rank)

    @property
    def model(self) -> torch.nn.Module:
        return self.trainer.model

    # ---- what the runtime calls
    def setup_distributed(self, address: str) -> None:
        """Join the DP group; with ``policy.dtensor_cfg.enabled`` shard the critic with FSDP2."""
        self.dp_rank.join(address)
        if self.policy.dtensor_cfg.enabled:
            self.shard_models()

    def shard_models(self) -> None:
        self.trainer.shard([], self.policy.dtensor_cfg.cpu_offload)

    def ping(self) -> int:
        return self.dp_rank.rank

    def placement(self) -> dict:
        return rank_block.placement()

    def node_address(self) -> str:
        return rank_block.node_address()

    # ---- values and training
    @torch.no_grad()
    def compute_values(self, meta: KVBatchMeta, out_field: str = VALUES) -> KVBatchMeta | None:
        """Forward the shard without gradients and write ``V(s_t)`` per token back as ``out_field``."""
        r = self.dp_rank
        lengths = r.lengths(meta)
        plan = microbatch_planner(self.policy, train=False)(torch.arange(len(meta), device=r.device), lengths)
        finish_lockstep = r.lockstep(self.model, len(plan))
        if len(meta) == 0:
            return finish_lockstep()
        ids = r.fetch(meta, [INPUT_IDS])[INPUT_IDS]  # (B, T)
        trim = self.policy.dynamic_batching.enabled
        self.model.eval()
        out = torch.zeros(ids.shape, dtype=torch.float32, device=r.device)  # (B, T)
        for mb in plan:
            out[mb.rows] = microbatch_values(self.model, ids, lengths, mb, trim)
        out = out.cpu()  # the data plane holds host tensors
        finish_lockstep()
        self.model.train()
        return r.put_rows(meta, out_field, out, lengths)

    def train(self, meta: KVBatchMeta, **_: Any) -> dict[str, float]:
        """Every global batch of this rank's shard with the clipped value loss (``value.loss_fn``) against the
        stored ``returns``, ``v_old`` = the stored ``values``."""
        p, v = self.policy, self.value
        data = self.dp_rank.fetch(meta, [INPUT_IDS, TOKEN_MASK, VALUES, RETURNS])
        lengths = self.dp_rank.lengths(meta)
        ids = data[INPUT_IDS]
        sample_mask = self.dp_rank.sample_mask(meta)  # (B,)
        # Position 0 is never a response token.
        batch = {TOKEN_MASK: data[TOKEN_MASK][:, 1:].float(), VALUES: data[VALUES][:, 1:],
                 RETURNS: data[RETURNS][:, 1:]}

        def forward(mb: MicroBatch) -> torch.Tensor:
            return microbatch_values(self.model, ids, lengths, mb, p.dynamic_batching.enabled)[:, 1:]  # (b, T-1)

        plan = microbatch_planner(p, train=True)
        return self.trainer.train_global_batches(
            batch[TOKEN_MASK], sample_mask, p.train_global_batch_size, lambda rows: plan(rows, lengths),
            v.max_grad_norm, forward, CriticLoss(v.loss_fn.cliprange, v.loss_fn.scale), batch,
        )

    # ---- weights and state
    def get_weights(self) -> dict[str, torch.Tensor]:
        """Host copies of the whole weights; under FSDP a gather every rank calls (rank 0 gets them)."""
        return parallel.full_state_dict(self.model)

    def save(self, path: str) -> None:
        """HF weights + tokenizer to ``path/weights``, optimizer state to ``path/optimizer.pt`` (rank 0)."""
        self.trainer.save(path, self.tokenizer, {})

    def apply_optimizer_settings(self, lr: float, weight_decay: float, betas: list[float], eps: float) -> None:
        """After a resume: this run's optimizer settings replace the checkpoint's (``Trainer``'s)."""
        self.trainer.apply_optimizer_settings(lr, weight_decay, betas, eps)

    def load(self, path: str) -> None:
        self.trainer.load(path, self._load_weights, {})

    def _load_weights(self, weights_dir: str) -> None:
        from rlplane.utils.checkpoint import check_weights_fit, load_weights

        check_weights_fit(self.model, weights_dir, "resume with the run's own value settings (its config.yaml)")
        parallel.load_full_state_dict(self.model, load_weights(weights_dir))
