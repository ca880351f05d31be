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
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from rlplane.algorithms.loss_options import ClippedPGOptions
from rlplane.algorithms.losses import clipped_pg_loss
from rlplane.config.schema import RunConfig
from rlplane.dataplane import DataPlaneClient, KVBatchMeta
from rlplane.dataplane.columns import (
    ADVANTAGES,
    COLUMNS,
    GENERATION_LOGPROBS,
    INPUT_IDS,
    PREV_LOGPROBS,
    REFERENCE_LOGPROBS,
    TOKEN_MASK,
)
from rlplane.generation.sampling import filtering_on, sampling_logprobs
from rlplane.models.lora import is_lora, load_policy_weights, policy_weights
from rlplane.models.precision import autocast
from rlplane.runtime.shared_paths import SharedPaths
from rlplane.workers import parallel, shared_prefix
from rlplane.workers.base import DPTrainWorker, build_optimizer, load_configured_policy
from rlplane.workers.packing import MicroBatch, forward_microbatch, microbatch_planner, pad_columns


class PolicyLoss(Protocol):
    """A loss the policy worker trains with, handed in by the recipe (frozen, pickles to Ray actors).

    ``columns`` are the data-plane columns it reads besides ``input_ids``; the worker fetches them
    for its shard, slices per-token ones ``[:, 1:]`` like the logprobs and passes the micro-batch's
    rows as ``batch``. Returns ``(loss, metrics)`` as the kernels do (global-count normalised).
    """

    def columns(self) -> list[str]: ...

    # Optional: ``wants_unfiltered_logprobs`` (bool) asks for ``(filtered, unfiltered)`` logprobs
    # when the sampler filters (top-k/top-p); see ClippedPGLoss.

    def __call__(self, curr_logprobs: torch.Tensor, batch: dict[str, torch.Tensor], sample_mask: torch.Tensor,
                 global_valid_tokens: torch.Tensor, global_valid_seqs: torch.Tensor): ...


@dataclass(frozen=True)
class ClippedPGLoss:
    """GRPO's and PPO's loss: :func:`clipped_pg_loss` with the run's ``loss_fn`` options."""

    options: ClippedPGOptions
    reference: bool  # the step wrote reference_policy_logprobs (the KL term's input)
    # No prev-logprob forward ran: π_old is this training forward, detached (config/plan.py's
    # skips_prev_logprob_forward: force_on_policy_ratio, or one optimizer step per rollout).
    prev_from_forward: bool = False

    def columns(self) -> list[str]:
        prev = [] if self.prev_from_forward or self.options.force_on_policy_ratio else [PREV_LOGPROBS]
        return [TOKEN_MASK, ADVANTAGES, GENERATION_LOGPROBS, *prev, *[REFERENCE_LOGPROBS] * self.reference]

    @property
    def wants_unfiltered_logprobs(self) -> bool:
        """With top-k/top-p sampling the KL term compares temperature-only logprobs (NeMo RL)."""
        return self.reference

    def __call__(self, curr_logprobs, batch, sample_mask, global_valid_tokens, global_valid_seqs):
        # (filtered, unfiltered) when wants_unfiltered_logprobs and the sampler filters; else filtered only.
        curr, curr_unfiltered = curr_logprobs if isinstance(curr_logprobs, tuple) else (curr_logprobs, None)
        return clipped_pg_loss(
            curr_logprobs=curr,
            curr_logprobs_unfiltered=curr_unfiltered,
            prev_logprobs=batch.get(PREV_LOGPROBS, curr.detach()),
            generation_logprobs=batch[GENERATION_LOGPROBS],
            reference_logprobs=batch.get(REFERENCE_LOGPROBS),
            advantages=batch[ADVANTAGES],
            token_mask=batch[TOKEN_MASK].float(),
            sample_mask=sample_mask,
            global_valid_tokens=global_valid_tokens,
            global_valid_seqs=global_valid_seqs,
            options=self.options,
        )


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
    return logprobs_from_logits(logits, input_ids, temperature, top_k, top_p, unfiltered)


def logprobs_from_logits(logits, input_ids, temperature, top_k=None, top_p=1.0, unfiltered=False):
    """:func:`token_logprobs` after the forward: ``logits`` (B, T, V) of ``input_ids`` (B, T)."""
    logits = logits[:, :-1].float()
    targets = input_ids[:, 1:]  # (B, T-1)
    logp = sampling_logprobs(logits, temperature=temperature, top_k=top_k, top_p=top_p, tokens=targets)  # (B, T-1)
    if not unfiltered:
        return F.pad(logp, (1, 0))
    plain = sampling_logprobs(logits, temperature=temperature, top_k=None, top_p=1.0, tokens=targets)
    return F.pad(logp, (1, 0)), F.pad(plain, (1, 0))


def microbatch_logprobs(model, input_ids, lengths, mb: MicroBatch, trim: bool, temperature, top_k=None, top_p=1.0,
                        unfiltered=False, only: torch.Tensor | None = None, prompt_lens: torch.Tensor | None = None,
                        pad_id: int = 0):
    """:func:`token_logprobs` of the micro-batch ``mb`` (fixed, token-budget or packed,
    ``workers/packing.py``) as (b, T) rows in ``mb.rows`` order, T = ``input_ids``' width.

    ``only`` (b, T) bool, the tokens a loss reads (its token mask): the logprobs of those tokens alone
    are computed, the rest are 0 (ignored with packing: every token is computed). Why: on a chat model's
    GRPO batch prompts and padding are most of each row (SmolLM2 preset: ~9 generated tokens of ~80
    columns), and the fp32 vocabulary projection (49152 wide) and its log-softmax cost a fifth of a
    forward+backward at every column they run on.

    ``prompt_lens`` (B,) from :func:`shared_prefix.prompt_lengths` (``policy.shared_prefix_forward``): on
    unpacked rows each distinct prompt runs once (:func:`shared_prefix.shared_prefix_logprobs`).
    """
    packed = mb.packing is not None
    if prompt_lens is not None and not packed:
        return shared_prefix.shared_prefix_logprobs(model, input_ids, lengths, prompt_lens, mb.rows, temperature,
                                                    top_k, top_p, unfiltered, pad_id)
    # Logits at column t predict token t + 1: the wanted logits sit one column left of the wanted tokens.
    at = F.pad(only[:, 1:].bool(), (0, 1)) if only is not None and not packed else None  # (b, T)
    with autocast(model):
        logits, ids = forward_microbatch(model, input_ids, lengths, mb, trim, at)  # (b, L, V) or (N, V); (b, L)
    width = input_ids.shape[1]
    if at is None:
        lp = logprobs_from_logits(logits, ids, temperature, top_k, top_p, unfiltered)
        return tuple(pad_columns(x, width) for x in lp) if unfiltered else pad_columns(lp, width)
    at = at[:, : ids.shape[1] - 1]  # (b, L-1): the logits columns kept, in the order of logits' rows
    targets = ids[:, 1:][at]  # (N,)
    lp = (sampling_logprobs(logits.float(), temperature=temperature, top_k=top_k, top_p=top_p, tokens=targets),)
    if unfiltered:
        lp += (sampling_logprobs(logits.float(), temperature=temperature, top_k=None, top_p=1.0, tokens=targets),)
    # Back to (b, T) rows: token t + 1's logprob at column t + 1, 0 at every token not computed.
    lp = tuple(pad_columns(F.pad(torch.zeros(at.shape, device=x.device).masked_scatter(at, x), (1, 0)), width)
               for x in lp)
    return lp if unfiltered else lp[0]


class PolicyWorker(DPTrainWorker):
    """One data-parallel rank of the policy (and of the frozen reference policy)."""

    def __init__(
        self,
        cfg: RunConfig,
        data_plane: DataPlaneClient | None,
        rank: int = 0,
        world_size: int = 1,
        init_state: dict[str, torch.Tensor] | None = None,
        shared_paths: SharedPaths | None = None,
    ):
        self._start("policy worker", cfg, data_plane, rank, world_size, shared_paths)
        self.model, self.tokenizer = load_configured_policy(cfg, trainable=True, init_state=init_state)
        self.model.to(self.device)
        self.reference = None
        if self._needs_reference():
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.model.train()
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.policy.optimizer, cfg.policy.scheduler)
        self.group = None

    # ---- helpers ---------------------------------------------------------------------------------
    def frozen_models(self) -> dict[str, torch.nn.Module]:
        return {"reference": self.reference} if self.reference is not None else {}

    def _needs_reference(self) -> bool:
        return (
            self.cfg.loss_fn.reference_policy_kl_penalty != 0
            and not self.cfg.loop.skip_reference_policy_logprobs_calculation
        )

    # ---- logprobs --------------------------------------------------------------------------------
    @torch.no_grad()
    def compute_logprobs(
        self, meta: KVBatchMeta, out_field: str = PREV_LOGPROBS, reference: bool = False
    ) -> KVBatchMeta | None:
        """Forward the shard without gradients and write per-token logprobs back as ``out_field``."""
        model = self.reference if reference else self.model
        lengths = torch.tensor(meta.seq_lens or (), dtype=torch.long, device=self.device)
        plan = microbatch_planner(self.cfg.policy, train=False)(torch.arange(len(meta), device=self.device), lengths)
        finish_lockstep = self._lockstep(model, len(plan))
        if len(meta) == 0:
            return finish_lockstep()
        # policy.shared_prefix_forward here too: the training forward's own numbers, so a prev-logprob forward
        # of the weights being trained gives a ratio of exactly 1, as with the plain forward in both.
        shared = shared_prefix.applies(self.cfg.policy)
        data = self._fetch(meta, [INPUT_IDS, TOKEN_MASK] if shared else [INPUT_IDS])
        ids = data[INPUT_IDS]  # (B, T)
        prompts = shared_prefix.prompt_lengths(data[TOKEN_MASK], lengths) if shared else None
        gen = self.cfg.policy.generation
        # The reference's filtered set is not the policy's: its logprobs stay unfiltered (NeMo RL's
        # use_reference_model), and the loss compares them with the policy's unfiltered ones.
        top_k, top_p = (None, 1.0) if reference else (gen.top_k, gen.top_p)
        trim = self.cfg.policy.dynamic_batching.enabled
        was_training = model.training
        model.eval()
        out = torch.zeros(ids.shape, dtype=torch.float32, device=self.device)  # (B, T)
        for mb in plan:
            out[mb.rows] = microbatch_logprobs(model, ids, lengths, mb, trim, gen.temperature, top_k, top_p,
                                               prompt_lens=prompts, pad_id=self.tokenizer.pad_token_id or 0)
        out = out.cpu()  # the data plane holds host tensors
        finish_lockstep()
        model.train(was_training)
        # The write-back's receipt goes back to the driver: a driver-held index (data_plane.index:
        # driver) takes the write when it arrives, and the store actor's ignores it.
        return self.dp.put_samples(
            list(meta.sample_ids), meta.partition_id, {out_field: [out[i, : lengths[i]] for i in range(len(ids))]}
        )

    # ---- training ------------------------------------------------------------------------------
    def train(self, meta: KVBatchMeta, loss: PolicyLoss) -> dict[str, float]:
        """Run every global batch of this rank's shard with ``loss``: micro-batches, all-reduce, clip, AdamW step."""
        cfg = self.cfg
        columns = loss.columns()
        data = self._fetch(meta, [INPUT_IDS, *columns])
        sample_mask = torch.tensor([float(t.get("sample_mask", 1.0)) for t in meta.tags], device=self.device)  # (B,)
        lengths = torch.tensor(meta.seq_lens, dtype=torch.long, device=self.device)
        ids = data[INPUT_IDS]  # (B, T)
        gen = cfg.policy.generation
        batch = {c: data[c][:,
                            1:] if COLUMNS[c].per_token else data[c] for c in columns}  # aligned with logprobs[:, 1:]
        # With top-k/top-p on, a KL-to-reference term needs the current policy's unfiltered logprobs as
        # well (the reference's are unfiltered); both come from one forward pass.
        split_kl = getattr(loss, "wants_unfiltered_logprobs", False) and filtering_on(gen.top_k, gen.top_p)

        # policy.shared_prefix_forward: each distinct prompt once per micro-batch, when the samples allow it.
        prompts = (shared_prefix.prompt_lengths(data[TOKEN_MASK], lengths)
                   if TOKEN_MASK in data and shared_prefix.applies(cfg.policy) else None)

        def forward(mb: MicroBatch):
            """(b, T-1) logprobs under the sampling distribution, or (filtered, unfiltered) with ``split_kl``;
            on the plain path 0 at the tokens the loss masks (not computed)."""
            lp = microbatch_logprobs(self.model, ids, lengths, mb, cfg.policy.dynamic_batching.enabled,
                                     gen.temperature, gen.top_k, gen.top_p, split_kl,
                                     only=data[TOKEN_MASK][mb.rows] if TOKEN_MASK in data else None,
                                     prompt_lens=prompts, pad_id=self.tokenizer.pad_token_id or 0)
            return (lp[0][:, 1:], lp[1][:, 1:]) if split_kl else lp[:, 1:]

        plan = microbatch_planner(cfg.policy, train=True)
        return self._train_global_batches(
            batch[TOKEN_MASK], sample_mask, cfg.policy.train_global_batch_size, lambda rows: plan(rows, lengths),
            cfg.policy.max_grad_norm, forward, loss, batch,
        )

    # ---- weights and state -----------------------------------------------------------------------
    def get_weights(self) -> dict[str, torch.Tensor]:
        """What a generator loads: host copies of the weights under HF names (merged, under LoRA;
        under FSDP a gather every rank calls, rank 0 gets them)."""
        if parallel.is_sharded(self.model):
            return parallel.full_state_dict(self.model)
        return policy_weights(self.model)

    def save(self, path: str) -> None:
        """Write HF weights + tokenizer to ``path/weights`` and optimizer/scheduler state (rank 0 only;
        under FSDP every rank gathers the weights and writes its optimizer shard)."""
        if parallel.is_sharded(self.model):
            return self._save_sharded(path)
        if self.rank != 0:
            return
        self.model.save_pretrained(os.path.join(path, "weights"), safe_serialization=True)
        self.tokenizer.save_pretrained(os.path.join(path, "weights"))
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        if self.reference is not None:
            state["reference"] = self.reference.state_dict()
        torch.save(state, os.path.join(path, "optimizer.pt"))

    def _save_sharded(self, path: str) -> None:
        weights = parallel.full_state_dict(self.model)
        if self.rank == 0:
            self.model.save_pretrained(os.path.join(path, "weights"), state_dict=weights, safe_serialization=True)
            self.tokenizer.save_pretrained(os.path.join(path, "weights"))
            torch.save({"scheduler": self.scheduler.state_dict()}, os.path.join(path, "scheduler.pt"))
        parallel.save_sharded_state(path, self.model, self.optimizer, self.frozen_models())

    def load(self, path: str) -> None:
        from rlplane.utils.checkpoint import check_weights_fit, load_torch_state, load_weights

        parallel.check_resume_layout(path, self.world_size, parallel.is_sharded(self.model))
        weights_dir = os.path.join(path, "weights")
        if is_lora(self.model):
            load_policy_weights(self.model, weights_dir)  # the LoRA adapter
        else:
            check_weights_fit(self.model, weights_dir, "resume with the run's own policy settings (its config.yaml)")
            # Tied embeddings are saved once (check_weights_fit allows a missing lm_head); single-file or sharded.
            parallel.load_full_state_dict(self.model, load_weights(weights_dir), strict=False)
        if parallel.is_sharded(self.model):
            parallel.load_sharded_state(path, self.model, self.optimizer, self.frozen_models())
            state = load_torch_state(os.path.join(path, "scheduler.pt"))
            return self.scheduler.load_state_dict(state["scheduler"])
        state = load_torch_state(os.path.join(path, "optimizer.pt"))
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.reference is not None and "reference" in state:
            self.reference.load_state_dict(state["reference"])

    def set_weights(self, state: dict[str, torch.Tensor]) -> None:
        parallel.load_full_state_dict(self.model, state)
        if self.reference is not None:
            parallel.load_full_state_dict(self.reference, state)
