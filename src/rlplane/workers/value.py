"""The value worker (PPO critic): the policy's architecture with a scalar head, on its DP shard.

The model is ``AutoModelForTokenClassification`` with ``num_labels = 1`` built from the policy's
config (for Llama: ``LlamaForTokenClassification``, the trunk plus a linear ``score`` head), so its
checkpoint is an ordinary HF directory. It starts from the policy's initial trunk weights (the
warm-up state, or ``policy.model_name``) and a zero head: V ≡ 0 before the first update.

Value convention (as NeMo RL): ``values[:, t] = V(s_t)``, the value of the state *before* token t,
which is the head's output at position t − 1 (it has seen tokens ≤ t − 1). So the head output is
right-shifted by one and ``values[:, 0] = 0``; with ``token_mask`` on response tokens, GAE and the
value loss use ``values``, ``returns`` and ``token_mask`` unshifted against each other.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AutoModelForTokenClassification

from rlplane.algorithms.losses import value_loss
from rlplane.config.schema import RunConfig
from rlplane.dataplane import DataPlaneClient, KVBatchMeta
from rlplane.dataplane.columns import INPUT_IDS, RETURNS, TOKEN_MASK, VALUES
from rlplane.runtime.shared_paths import SharedPaths
from rlplane.workers import parallel
from rlplane.workers.base import DPTrainWorker, build_optimizer, load_configured_policy
from rlplane.workers.packing import MicroBatch, forward_microbatch, microbatch_planner, pad_columns


@dataclass(frozen=True)
class CriticLoss:
    """The critic's clipped MSE (``value.loss_fn``) over the stored ``values`` (v_old) and ``returns``."""

    cliprange: float | None
    scale: float

    def __call__(self, values, batch, sample_mask, global_valid_tokens, _global_valid_seqs):
        return value_loss(values, batch[VALUES], batch[RETURNS], batch[TOKEN_MASK], global_valid_tokens,
                          clip_range=self.cliprange, sample_mask=sample_mask, scale=self.scale)


def build_value_model(cfg: RunConfig, init_state: dict[str, torch.Tensor] | None = None):
    """``(value_model, tokenizer)``: the policy's trunk (``init_state`` = a causal-LM state dict, if
    given) under a zero-initialised scalar head. Deterministic; leaves the global RNG untouched."""
    causal, tokenizer = load_configured_policy(cfg)
    if init_state is not None:
        causal.load_state_dict(init_state)
    config = copy.deepcopy(causal.config)
    config.num_labels = 1
    config.classifier_dropout = 0.0  # values must not depend on train/eval mode (old values vs training)
    config.architectures = None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.loop.seed)
        model = AutoModelForTokenClassification.from_config(config)
    trunk = getattr(model, model.base_model_prefix)
    trunk.load_state_dict(getattr(causal, causal.base_model_prefix).state_dict())
    head = model.score
    torch.nn.init.zeros_(head.weight)
    if head.bias is not None:
        torch.nn.init.zeros_(head.bias)
    return model.to(torch.float32), tokenizer


def shifted_values(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) ``V(s_t)``: the scalar head at t − 1 shifted right by one; position 0 is 0."""
    head = model(input_ids=input_ids, attention_mask=attention_mask).logits[..., 0].float()  # (B, T)
    return F.pad(head[:, :-1], (1, 0))


def microbatch_values(model, input_ids: torch.Tensor, lengths: torch.Tensor, mb: MicroBatch, trim: bool):
    """:func:`shifted_values` of the micro-batch ``mb`` (fixed, token-budget or packed, ``workers/packing.py``)
    as (b, T) rows in ``mb.rows`` order, T = ``input_ids``' width."""
    out, _ = forward_microbatch(model, input_ids, lengths, mb, trim)  # (b, L, 1)
    return pad_columns(F.pad(out[..., 0].float()[:, :-1], (1, 0)), input_ids.shape[1])


class ValueWorker(DPTrainWorker):
    """One data-parallel rank of the critic: ``compute_values`` and ``train`` on its shard."""

    def __init__(
        self,
        cfg: RunConfig,
        data_plane: DataPlaneClient | None,
        rank: int = 0,
        world_size: int = 1,
        init_state: dict[str, torch.Tensor] | None = None,
        shared_paths: SharedPaths | None = None,
    ):
        self._start("value worker", cfg, data_plane, rank, world_size, shared_paths)
        self.model, self.tokenizer = build_value_model(cfg, init_state)
        self.model.to(self.device)
        self.model.train()
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.value.optimizer, cfg.value.scheduler)
        self.group = None

    @torch.no_grad()
    def compute_values(self, meta: KVBatchMeta, out_field: str = VALUES) -> KVBatchMeta | None:
        """Forward the shard without gradients and write ``V(s_t)`` per token back as ``out_field``."""
        lengths = torch.tensor(meta.seq_lens or (), dtype=torch.long, device=self.device)
        plan = microbatch_planner(self.cfg.policy, train=False)(torch.arange(len(meta), device=self.device), lengths)
        finish_lockstep = self._lockstep(self.model, len(plan))
        if len(meta) == 0:
            return finish_lockstep()
        ids = self._fetch(meta, [INPUT_IDS])[INPUT_IDS]  # (B, T)
        trim = self.cfg.policy.dynamic_batching.enabled
        self.model.eval()
        out = torch.zeros(ids.shape, dtype=torch.float32, device=self.device)  # (B, T)
        for mb in plan:
            out[mb.rows] = microbatch_values(self.model, ids, lengths, mb, trim)
        out = out.cpu()  # the data plane holds host tensors
        finish_lockstep()
        self.model.train()
        # The write-back's receipt goes back to the driver: a driver-held index (data_plane.index:
        # driver) takes the write when it arrives, and the store actor's ignores it.
        return self.dp.put_samples(
            list(meta.sample_ids), meta.partition_id, {out_field: [out[i, : lengths[i]] for i in range(len(ids))]}
        )

    def train(self, meta: KVBatchMeta, **_: Any) -> dict[str, float]:
        """Every global batch of this rank's shard with the clipped value loss (``value.loss_fn``):
        ``0.5·scale·Σ max((v − R)², (clamp(v, v_old ± ε) − R)²)·m / N_tok`` against the stored
        ``returns``, ``v_old`` = the stored ``values``. Metrics: :func:`rlplane.algorithms.value_loss`'s."""
        cfg = self.cfg
        data = self._fetch(meta, [INPUT_IDS, TOKEN_MASK, VALUES, RETURNS])
        lengths = torch.tensor(meta.seq_lens, dtype=torch.long, device=self.device)
        ids = data[INPUT_IDS]
        sample_mask = torch.tensor([float(t.get("sample_mask", 1.0)) for t in meta.tags], device=self.device)  # (B,)
        # Position 0 is never a response token; values/returns are aligned with the token mask.
        batch = {TOKEN_MASK: data[TOKEN_MASK][:, 1:].float(), VALUES: data[VALUES][:, 1:],
                 RETURNS: data[RETURNS][:, 1:]}

        def forward(mb: MicroBatch) -> torch.Tensor:
            trim = cfg.policy.dynamic_batching.enabled
            return microbatch_values(self.model, ids, lengths, mb, trim)[:, 1:]  # (b, T-1)

        plan = microbatch_planner(cfg.policy, train=True)
        return self._train_global_batches(
            batch[TOKEN_MASK], sample_mask, cfg.policy.train_global_batch_size, lambda rows: plan(rows, lengths),
            cfg.value.max_grad_norm, forward, CriticLoss(cfg.value.loss_fn.cliprange, cfg.value.loss_fn.scale), batch,
        )

    # ---- weights and state -----------------------------------------------------------------------
    def get_weights(self) -> dict[str, torch.Tensor]:
        """Host copies of the whole weights; under FSDP a gather every rank calls (rank 0 gets them)."""
        return parallel.full_state_dict(self.model)

    def save(self, path: str) -> None:
        """HF weights (``AutoModelForTokenClassification.from_pretrained`` loads them) + tokenizer to
        ``path/weights``, optimizer/scheduler state to ``path/optimizer.pt`` (rank 0 only; under FSDP
        every rank gathers the weights and writes its optimizer shard)."""
        if parallel.is_sharded(self.model):
            weights = parallel.full_state_dict(self.model)
            if self.rank == 0:
                self.model.save_pretrained(os.path.join(path, "weights"), state_dict=weights, safe_serialization=True)
                self.tokenizer.save_pretrained(os.path.join(path, "weights"))
                torch.save({"scheduler": self.scheduler.state_dict()}, os.path.join(path, "scheduler.pt"))
            return parallel.save_sharded_state(path, self.model, self.optimizer, {})
        if self.rank != 0:
            return
        self.model.save_pretrained(os.path.join(path, "weights"), safe_serialization=True)
        self.tokenizer.save_pretrained(os.path.join(path, "weights"))
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        torch.save(state, os.path.join(path, "optimizer.pt"))

    def load(self, path: str) -> None:
        from rlplane.utils.checkpoint import check_weights_fit, load_torch_state, load_weights

        parallel.check_resume_layout(path, self.world_size, parallel.is_sharded(self.model))
        weights_dir = os.path.join(path, "weights")
        check_weights_fit(self.model, weights_dir, "resume with the run's own value settings (its config.yaml)")
        parallel.load_full_state_dict(self.model, load_weights(weights_dir))
        if parallel.is_sharded(self.model):
            parallel.load_sharded_state(path, self.model, self.optimizer, {})
            state = load_torch_state(os.path.join(path, "scheduler.pt"))
            return self.scheduler.load_state_dict(state["scheduler"])
        state = load_torch_state(os.path.join(path, "optimizer.pt"))
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
