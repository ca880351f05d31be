"""The policy worker: logprobs and training on its data-parallel shard of a step.

A plain class. ``runtime: local`` calls it in the driver's process; ``runtime: ray`` wraps the
same class as an actor, one per data-parallel rank, with gradients summed over a gloo group.
It never receives bulk tensors from the driver: it is handed a :class:`KVBatchMeta` receipt for
its shard, fetches the fields it needs from the data plane, and writes results back there.

Logprob convention (as in the seeds): ``logprobs[:, t] = log π(token_t | tokens_<t)`` under the
sampling distribution of ``policy.generation`` (``logits / temperature``, then top-k, then top-p,
renormalised: :func:`rlplane.generation.sampling.sampling_logprobs`, the function the sampler draws
with), ``logprobs[:, 0] = 0``. The loss sees every per-token tensor sliced ``[:, 1:]``.
As in NeMo RL, the reference policy's logprobs and the current policy's logprobs inside the KL term
are unfiltered (temperature only): the reference's top-k/top-p set differs from the policy's.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch
import torch.nn.functional as F

from rlplane.algorithms.losses import clipped_pg_loss
from rlplane.config.plan import skips_prev_logprob_forward
from rlplane.config.schema import RunConfig
from rlplane.dataplane import DataPlaneClient, KVBatchMeta
from rlplane.generation.sampling import filtering_on, sampling_logprobs
from rlplane.models.lora import is_lora, load_policy_weights, policy_weights
from rlplane.models.precision import autocast
from rlplane.workers.base import DPTrainWorker, build_optimizer, load_configured_policy
from rlplane.utils.threads import set_worker_threads

# Fields the trainer reads from the data plane, and the pad value of each.
PAD_VALUES = {
    "input_ids": 0,
    "token_mask": 0,
    "generation_logprobs": 0.0,
    "prev_logprobs": 0.0,
    "reference_policy_logprobs": 0.0,
    "advantages": 0.0,
}


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float,
    top_k: int | None = None,
    top_p: float = 1.0,
    unfiltered: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Per-token logprobs of ``input_ids`` under ``model``'s sampling distribution; (B, T), position 0 is 0.

    With ``unfiltered`` also returns the temperature-only logprobs of the same forward pass (for the
    KL term), as ``(filtered, unfiltered)``.
    """
    with autocast(model):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits  # (B, T, V)
    logits = logits[:, :-1].float()
    targets = input_ids[:, 1:]  # (B, T-1)
    logp = sampling_logprobs(logits, temperature=temperature, top_k=top_k, top_p=top_p, tokens=targets)  # (B, T-1)
    if not unfiltered:
        return F.pad(logp, (1, 0))
    plain = sampling_logprobs(logits, temperature=temperature, top_k=None, top_p=1.0, tokens=targets)
    return F.pad(logp, (1, 0)), F.pad(plain, (1, 0))


class PolicyWorker(DPTrainWorker):
    """One data-parallel rank of the policy (and of the frozen reference policy)."""

    pad_values = PAD_VALUES

    def __init__(
        self,
        cfg: RunConfig,
        data_plane: DataPlaneClient | None,
        rank: int = 0,
        world_size: int = 1,
        init_state: dict[str, torch.Tensor] | None = None,
    ):
        self.cfg, self.dp, self.rank, self.world_size = cfg, data_plane, rank, world_size
        set_worker_threads(cfg.policy.threads_per_worker)
        self.model, self.tokenizer = load_configured_policy(cfg, trainable=True, init_state=init_state)
        self.reference = None
        if self._needs_reference():
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.model.train()
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.policy.optimizer, cfg.policy.scheduler)
        self.group = None

    # ---- helpers ---------------------------------------------------------------------------------
    def _needs_reference(self) -> bool:
        return (
            self.cfg.loss_fn.reference_policy_kl_penalty != 0
            and not self.cfg.loop.skip_reference_policy_logprobs_calculation
        )

    # ---- logprobs --------------------------------------------------------------------------------
    @torch.no_grad()
    def compute_logprobs(self, meta: KVBatchMeta, out_field: str = "prev_logprobs", reference: bool = False) -> None:
        """Forward the shard without gradients and write per-token logprobs back as ``out_field``."""
        if len(meta) == 0:
            return None
        model = self.reference if reference else self.model
        data = self._fetch(meta, ["input_ids"])
        ids = data["input_ids"]  # (B, T)
        lengths = torch.tensor(meta.seq_lens, dtype=torch.long)
        attn = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()  # (B, T)
        gen = self.cfg.policy.generation
        # The reference's filtered set is not the policy's: its logprobs stay unfiltered (NeMo RL's
        # use_reference_model), and the loss compares them with the policy's unfiltered ones.
        top_k, top_p = (None, 1.0) if reference else (gen.top_k, gen.top_p)
        bs = self.cfg.policy.logprob_batch_size
        was_training = model.training
        model.eval()
        out = torch.cat([
            token_logprobs(model, ids[i : i + bs], attn[i : i + bs], gen.temperature, top_k, top_p)
            for i in range(0, len(ids), bs)
        ])
        model.train(was_training)
        self.dp.put_samples(
            list(meta.sample_ids), meta.partition_id, {out_field: [out[i, : lengths[i]] for i in range(len(ids))]}
        )
        return None

    # ---- training --------------------------------------------------------------------------------
    def train(self, meta: KVBatchMeta, loss_kwargs: dict[str, Any]) -> dict[str, float]:
        """Run every global batch of this rank's shard: micro-batches, all-reduce, clip, AdamW step."""
        cfg = self.cfg
        fields = ["input_ids", "token_mask", "advantages", "generation_logprobs"]
        # One optimizer step per rollout: π_old is this very forward, detached (config/plan.py).
        use_prev = not (loss_kwargs.get("force_on_policy_ratio", False) or skips_prev_logprob_forward(cfg))
        use_ref = self.reference is not None
        fields += ["prev_logprobs"] * use_prev + ["reference_policy_logprobs"] * use_ref
        data = self._fetch(meta, fields)
        sample_mask = torch.tensor([float(t.get("sample_mask", 1.0)) for t in meta.tags])  # (B,)
        lengths = torch.tensor(meta.seq_lens, dtype=torch.long)
        ids = data["input_ids"]
        attn = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
        gen = cfg.policy.generation
        # With top-k/top-p on, the KL term needs the current policy's unfiltered logprobs as well
        # (the reference's are unfiltered); both come from one forward pass.
        split_kl = use_ref and filtering_on(gen.top_k, gen.top_p)

        def mb_loss(mb: slice, global_toks: torch.Tensor, global_seqs: torch.Tensor):
            lp = token_logprobs(self.model, ids[mb], attn[mb], gen.temperature, gen.top_k, gen.top_p, split_kl)
            curr, curr_unfiltered = (lp[0][:, 1:], lp[1][:, 1:]) if split_kl else (lp[:, 1:], None)  # (b, T-1)
            return clipped_pg_loss(
                curr_logprobs=curr,
                curr_logprobs_unfiltered=curr_unfiltered,
                prev_logprobs=data["prev_logprobs"][mb, 1:] if use_prev else curr.detach(),
                generation_logprobs=data["generation_logprobs"][mb, 1:],
                reference_logprobs=data["reference_policy_logprobs"][mb, 1:] if use_ref else None,
                advantages=data["advantages"][mb, 1:],
                token_mask=data["token_mask"][mb, 1:].float(),
                sample_mask=sample_mask[mb],
                global_valid_tokens=global_toks,
                global_valid_seqs=global_seqs,
                **loss_kwargs,
            )

        return self._train_global_batches(
            data["token_mask"][:, 1:], sample_mask, cfg.policy.train_global_batch_size,
            cfg.policy.train_micro_batch_size, cfg.policy.max_grad_norm, mb_loss,
        )

    # ---- weights and state -----------------------------------------------------------------------
    def get_weights(self) -> dict[str, torch.Tensor]:
        """What a generator loads: the weights under HF names (merged, under LoRA)."""
        return policy_weights(self.model)

    def save(self, path: str) -> None:
        """Write HF weights + tokenizer to ``path/weights`` and optimizer/scheduler state (rank 0 only)."""
        if self.rank != 0:
            return
        self.model.save_pretrained(os.path.join(path, "weights"), safe_serialization=True)
        self.tokenizer.save_pretrained(os.path.join(path, "weights"))
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        if self.reference is not None:
            state["reference"] = self.reference.state_dict()
        torch.save(state, os.path.join(path, "optimizer.pt"))

    def load(self, path: str) -> None:
        from rlplane.utils.checkpoint import check_weights_fit, load_torch_state, load_weights

        weights_dir = os.path.join(path, "weights")
        if is_lora(self.model):
            load_policy_weights(self.model, weights_dir)  # the LoRA adapter
        else:
            check_weights_fit(self.model, weights_dir, "resume with the run's own policy settings (its config.yaml)")
            # Tied embeddings are saved once (check_weights_fit allows a missing lm_head); single-file or sharded.
            self.model.load_state_dict(load_weights(weights_dir), strict=False)
        state = load_torch_state(os.path.join(path, "optimizer.pt"))
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.reference is not None and "reference" in state:
            self.reference.load_state_dict(state["reference"])

    def set_weights(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)
        if self.reference is not None:
            self.reference.load_state_dict(state)
