"""The policy worker: logprobs and training on its data-parallel shard of a step.

Handed a receipt for its shard, it fetches its columns from the data plane and writes results back. Made
of :class:`~rlplane.workers.rank.DPRank`, :class:`~rlplane.workers.trainer.Trainer` and, for the KL term,
a reference :class:`~rlplane.workers.scorer.Scorer`. The loss sees per-token tensors sliced ``[:, 1:]``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from rlplane.algorithms.loss_options import ClippedPGOptions
from rlplane.algorithms.losses import clipped_pg_loss
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
from rlplane.generation.sampling import filtering_on
from rlplane.models.configured import load_configured_policy
from rlplane.models.fingerprint import fingerprint
from rlplane.models.lora import is_lora, load_policy_weights, policy_weights
from rlplane.models.precision import autocast
from rlplane.runtime.shared_paths import SharedPaths
from rlplane.workers import parallel, rank as rank_block, shared_prefix
from rlplane.workers.logprobs import microbatch_logprobs
from rlplane.workers.packing import MicroBatch, forward_microbatch, microbatch_planner
from rlplane.workers.rank import DPRank
from rlplane.workers.scorer import Scorer, shard_logprobs
from rlplane.workers.trainer import Trainer
from rlplane.workers.weight_sync import model_precision, score_probes

if TYPE_CHECKING:
    from rlplane.config.policy import PolicyConfig


class PolicyLoss(Protocol):
    """A loss the policy worker trains with, handed in by the recipe (frozen, picklable).

    ``columns``: the columns it reads besides ``input_ids`` (per-token ones sliced ``[:, 1:]``), passed as
    ``batch``. Returns ``(loss, metrics)``, global-count normalised.
    """

    def columns(self) -> list[str]: ...

    # Optional ``wants_unfiltered_logprobs``: ``(filtered, unfiltered)`` logprobs under top-k/top-p.
    # Optional ``wants_logits``: the next-token logits over the temperature, (b, L-1, V), in place of logprobs
    # (L: the micro-batch's width; column t predicts token t + 1, as the batch's [:, 1:] columns).

    def __call__(self, curr_logprobs: torch.Tensor, batch: dict[str, torch.Tensor], sample_mask: torch.Tensor,
                 global_valid_tokens: torch.Tensor, global_valid_seqs: torch.Tensor): ...


@dataclass(frozen=True)
class ClippedPGLoss:
    """GRPO's and PPO's loss: :func:`clipped_pg_loss` with the run's ``loss_fn`` options."""

    options: ClippedPGOptions
    reference: bool  # the step wrote reference_policy_logprobs (the KL term's input)
    # π_old is this training forward, detached (the run plan's skips_prev_logprob_forward).
    prev_from_forward: bool = False

    def columns(self) -> list[str]:
        prev = [] if self.prev_from_forward or self.options.force_on_policy_ratio else [PREV_LOGPROBS]
        return [TOKEN_MASK, ADVANTAGES, GENERATION_LOGPROBS, *prev, *[REFERENCE_LOGPROBS] * self.reference]

    @property
    def wants_unfiltered_logprobs(self) -> bool:
        """With top-k/top-p sampling the KL term compares temperature-only logprobs (NeMo RL)."""
        return self.reference

    def __call__(self, curr_logprobs, batch, sample_mask, global_valid_tokens, global_valid_seqs):
        # (filtered, unfiltered) when wants_unfiltered_logprobs and the sampler filters.
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


@dataclass(frozen=True)
class PolicyWorkerOptions:
    """What a policy rank takes from the run's config (the run plan builds it: ``training/plan.py``)."""

    policy: PolicyConfig  # the ``policy`` section: model, optimizer, micro-batching, sampling, device
    seed: int  # the run's seed: the embedded model's initialisation
    reference: bool  # keep a frozen copy of the initial weights: π_ref of the loss's KL term
    fingerprint_sent: bool = False  # fingerprint the weights get_weights sends (the weight-sync check is on)


class PolicyWorker:
    """One data-parallel rank of the policy (and of the frozen reference policy)."""

    def __init__(
        self,
        options: PolicyWorkerOptions,
        data_plane: DataPlaneClient | None,
        rank: int = 0,
        world_size: int = 1,
        init_state: dict[str, torch.Tensor] | None = None,
        shared_paths: SharedPaths | None = None,
    ):
        p = self.policy = options.policy
        self.fingerprint_sent = options.fingerprint_sent
        self._sent = None  # the fingerprint of the weights get_weights sent last
        self.dp_rank = DPRank("policy worker", p, data_plane, rank, world_size, shared_paths)
        model, self.tokenizer = load_configured_policy(p, options.seed, trainable=True, init_state=init_state)
        self.pad_id = self.tokenizer.pad_token_id or 0
        self.trainer = Trainer(model, p.optimizer, p.scheduler, self.dp_rank)
        self.reference = None
        if options.reference:
            self.reference = Scorer(copy.deepcopy(self.trainer.model), self.dp_rank, p, self.pad_id, filtered=False)

    @property
    def model(self) -> torch.nn.Module:
        """The trained model (a local generator samples from this very module)."""
        return self.trainer.model

    def frozen_models(self) -> dict[str, torch.nn.Module]:
        return {"reference": self.reference.model} if self.reference is not None else {}

    # ---- what the runtime calls
    def setup_distributed(self, address: str) -> None:
        """Join the DP group (every rank at once); with ``policy.dtensor_cfg.enabled`` shard with FSDP2."""
        self.dp_rank.join(address)
        if self.policy.dtensor_cfg.enabled:
            self.shard_models()

    def shard_models(self) -> None:
        """FSDP2-shard the trained model and the reference over the joined group."""
        self.trainer.shard(list(self.frozen_models().values()), self.policy.dtensor_cfg.cpu_offload)

    def ping(self) -> int:
        return self.dp_rank.rank

    def placement(self) -> dict:
        return rank_block.placement()

    def node_address(self) -> str:
        return rank_block.node_address()

    # ---- logprobs
    def compute_logprobs(
        self, meta: KVBatchMeta, out_field: str = PREV_LOGPROBS, reference: bool = False,
        micro_batch_size: int | None = None,
    ) -> KVBatchMeta | None:
        """No-grad logprobs of the shard written back as ``out_field``: the model's (sampling distribution)
        or the reference's (temperature only); ``micro_batch_size`` None: ``policy.logprob_batch_size``."""
        if reference:
            return self.reference.write_logprobs(meta, out_field, micro_batch_size)
        return shard_logprobs(self.dp_rank, self.model, meta, out_field, self.policy, self.pad_id, filtered=True,
                              micro_batch_size=micro_batch_size)

    # ---- training
    def train(self, meta: KVBatchMeta, loss: PolicyLoss, eval_mode: bool = False, gbs: int | None = None,
              mbs: int | None = None) -> dict[str, float]:
        """Run every global batch of this rank's shard with ``loss``: micro-batches, all-reduce, clip, AdamW step.

        ``eval_mode``: loss and metrics only (no gradients, no optimizer or scheduler step); ``gbs`` / ``mbs``:
        global and micro-batch sizes for this call (None: ``train_global_batch_size`` / ``train_micro_batch_size``).
        """
        p = self.policy
        columns = loss.columns()
        data = self.dp_rank.fetch(meta, [INPUT_IDS, *columns])
        sample_mask = self.dp_rank.sample_mask(meta)  # (B,)
        lengths = self.dp_rank.lengths(meta)
        ids = data[INPUT_IDS]  # (B, T)
        gen = p.generation
        batch = {c: data[c][:,
                            1:] if COLUMNS[c].per_token else data[c] for c in columns}  # aligned with logprobs[:, 1:]
        # With top-k/top-p a KL term also needs unfiltered logprobs: both from one forward.
        split_kl = getattr(loss, "wants_unfiltered_logprobs", False) and filtering_on(gen.top_k, gen.top_p)

        # policy.shared_prefix_forward: each distinct prompt once per micro-batch, when the samples allow it.
        prompts = (shared_prefix.prompt_lengths(data[TOKEN_MASK], lengths)
                   if TOKEN_MASK in data and shared_prefix.applies(p) else None)

        def forward(mb: MicroBatch):
            """(b, T-1) logprobs, or (filtered, unfiltered) with ``split_kl``; 0 at masked tokens on the plain path;
            or the loss's logits (``wants_logits``)."""
            if getattr(loss, "wants_logits", False):
                with autocast(self.model):
                    logits, _ = forward_microbatch(self.model, ids, lengths, mb, p.dynamic_batching.enabled)
                return logits[:, :-1].float() / gen.temperature  # (b, L-1, V)
            lp = microbatch_logprobs(self.model, ids, lengths, mb, p.dynamic_batching.enabled,
                                     gen.temperature, gen.top_k, gen.top_p, split_kl,
                                     only=data[TOKEN_MASK][mb.rows] if TOKEN_MASK in data else None,
                                     prompt_lens=prompts, pad_id=self.pad_id)
            return (lp[0][:, 1:], lp[1][:, 1:]) if split_kl else lp[:, 1:]

        plan = microbatch_planner(p, train=True, size=mbs)
        return self.trainer.train_global_batches(
            batch[TOKEN_MASK], sample_mask, gbs or p.train_global_batch_size, lambda rows: plan(rows, lengths),
            p.max_grad_norm, forward, loss, batch, eval_mode=eval_mode,
        )

    # ---- weights and state
    def get_weights(self) -> dict[str, torch.Tensor]:
        """Host copies of the weights under HF names (merged under LoRA; under FSDP every rank gathers);
        their fingerprint is kept for the weight-sync check."""
        sharded = parallel.is_sharded(self.model)
        weights = parallel.full_state_dict(self.model) if sharded else policy_weights(self.model)
        if self.fingerprint_sent:
            self._sent = fingerprint(weights)
        return weights

    def weight_check(self, probes: list[tuple[list[int], list[int]]], shared: bool = False) -> dict:
        """The trainer's half of a weight-sync check: the last sent weights' fingerprint (None if ``shared``),
        its precision and its logprobs of each probe's tokens (under FSDP every rank runs it)."""
        sent = None if shared else self._sent
        scores = score_probes(self.model, probes, self.policy.generation, self.pad_id) if probes else []
        return {"fingerprint": sent, "precision": model_precision(self.model), "probe_logprobs": scores}

    def save(self, path: str) -> None:
        """HF weights + tokenizer to ``path/weights`` and optimizer state (rank 0; under FSDP each rank its shard)."""
        self.trainer.save(path, self.tokenizer, self.frozen_models())

    def apply_optimizer_settings(self, lr: float, weight_decay: float, betas: list[float], eps: float) -> None:
        """After a resume: this run's optimizer settings replace the checkpoint's (``Trainer``'s)."""
        self.trainer.apply_optimizer_settings(lr, weight_decay, betas, eps)

    def load(self, path: str) -> None:
        self.trainer.load(path, self._load_weights, self.frozen_models())

    def _load_weights(self, weights_dir: str) -> None:
        from rlplane.utils.checkpoint import check_weights_fit, load_weights

        if is_lora(self.model):
            load_policy_weights(self.model, weights_dir)  # the LoRA adapter
        else:
            check_weights_fit(self.model, weights_dir, "resume with the run's own policy settings (its config.yaml)")
            # Tied embeddings are saved once; single-file or sharded.
            parallel.load_full_state_dict(self.model, load_weights(weights_dir), strict=False)

    def set_weights(self, state: dict[str, torch.Tensor]) -> None:
        parallel.load_full_state_dict(self.model, state)
        if self.reference is not None:
            parallel.load_full_state_dict(self.reference.model, state)
