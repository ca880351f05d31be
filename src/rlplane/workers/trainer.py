"""The trainer block of the policy and value workers: a model, AdamW and schedule, and the global-batch
loop (micro-batches → summed gradients → DP all-reduce → clip → step), plus its checkpoint state."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable

import torch

from rlplane.config.policy import OptimizerConfig, SchedulerConfig
from rlplane.fast.allocator import keep_freed_memory, limit_malloc_arenas
from rlplane.fast.attention_backward import matmul_attention_backward
from rlplane.fast.sparse_embedding import densify_embedding_grad, sparse_embedding_grad
from rlplane.models.precision import weight_casts_kept
from rlplane.utils.metrics import reduce_microbatch_metrics
from rlplane.workers import parallel
from rlplane.workers.packing import MicroBatch
from rlplane.workers.rank import DPRank

# (model output, micro-batch rows, sample mask, global valid tokens, global valid seqs) -> (loss, metrics)
MicroBatchLoss = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]


def lr_factor(step: int, sch: SchedulerConfig) -> float:
    """The lr multiplier at optimizer step ``step`` (0-based): linear warm-up from ``warmup_start_factor`` to 1
    over ``warmup_steps``, then ``decay`` from 1 to ``min_lr_factor`` over ``decay_steps``, flat after."""
    if step < sch.warmup_steps:
        return sch.warmup_start_factor + (1.0 - sch.warmup_start_factor) * step / sch.warmup_steps
    if sch.decay == "constant":
        return 1.0
    done = min(1.0, (step - sch.warmup_steps) / sch.decay_steps)  # fraction of the fall behind
    fall = done if sch.decay == "linear" else 0.5 * (1.0 - math.cos(math.pi * done))
    return 1.0 - (1.0 - sch.min_lr_factor) * fall


def build_optimizer(model: torch.nn.Module, opt: OptimizerConfig, sch: SchedulerConfig):
    """``(AdamW over trainable parameters, LambdaLR following lr_factor)``."""
    # foreach: one op per term over all tensors (the default only on GPUs); same numbers on CPU.
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=opt.lr, weight_decay=opt.weight_decay,
        betas=tuple(opt.betas), eps=opt.eps, foreach=True
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, sch))
    return optimizer, scheduler


class Trainer:
    """``model`` on ``rank.device`` in train mode, with AdamW and schedule, training on ``rank``'s shard."""

    def __init__(self, model: torch.nn.Module, optimizer: OptimizerConfig, scheduler: SchedulerConfig, rank: DPRank):
        self.rank = rank
        if rank.device.type == "cpu":
            # Each micro-batch frees and reallocates tensors of tens of MB (logits, gradients); kept in the heap
            # they are not faulted in afresh (a generator in this process does the same).
            keep_freed_memory()
            limit_malloc_arenas()
        self.model = model.to(rank.device)
        self.model.train()
        self.sparse_embedding = sparse_embedding_grad(self.model)
        self.optimizer, self.scheduler = build_optimizer(self.model, optimizer, scheduler)

    def shard(self, frozen: list[torch.nn.Module], cpu_offload: bool = False) -> None:
        """FSDP2-shard the model and ``frozen`` ones (their shards in host memory with ``cpu_offload``); the
        optimizer is rebuilt over the shards."""
        self.sparse_embedding = sparse_embedding_grad(self.model, on=False)  # FSDP takes dense gradients
        for m in (self.model, *frozen):
            parallel.shard_model(m, self.rank.device, self.rank.world_size, cpu_offload)
        self.optimizer, self.scheduler = parallel.rebuild_optimizer(self.model, self.optimizer, self.scheduler)

    def train_global_batches(
        self,
        token_mask: torch.Tensor,
        sample_mask: torch.Tensor,
        global_batch_size: int,
        plan: Callable[[torch.Tensor], list[MicroBatch]],
        max_grad_norm: float | None,
        forward: Callable[[MicroBatch], torch.Tensor],
        loss: MicroBatchLoss,
        batch: dict[str, torch.Tensor],
        eval_mode: bool = False,
    ) -> dict[str, float]:
        """One optimizer step per global batch of this rank's shard, then one scheduler step; ``eval_mode``: the
        same loss and metrics under ``no_grad`` in eval mode, no step (no ``grad_norm``).

        ``plan(rows)`` cuts micro-batches; per ``mb``: ``loss(forward(mb), {k: v[mb.rows]}, sample_mask[mb.rows],
        global_valid_tokens, global_valid_seqs)``, ``token_mask`` (B, T') sliced like the loss inputs. Global
        counts make the summed gradient the global-batch mean however rows are cut. Adds ``grad_norm``, ``lr``.
        """
        per_rank_gbs = global_batch_size // self.rank.world_size
        num_gb = max(1, len(token_mask) // per_rank_gbs)
        metrics_per_mb: list[dict[str, torch.Tensor]] = []
        grad_norms, valid_counts = [], []
        was_training = self.model.training
        self.model.train(not eval_mode)
        with torch.no_grad() if eval_mode else contextlib.nullcontext():
            for g in range(num_gb):
                counts, norm = self._global_batch(slice(g * per_rank_gbs, (g + 1) * per_rank_gbs), token_mask,
                                                  sample_mask, plan, max_grad_norm, forward, loss, batch,
                                                  metrics_per_mb, eval_mode)
                valid_counts.append(counts)
                grad_norms += [norm] if norm is not None else []
        self.model.train(was_training)
        if not eval_mode:
            self.scheduler.step()
        out = reduce_microbatch_metrics(metrics_per_mb, num_global_batches=num_gb)
        if grad_norms:
            out["grad_norm"] = float(torch.stack(grad_norms).mean())
        out["lr"] = self.optimizer.param_groups[0]["lr"]
        # Mean over the step's global batches (as NeMo RL).
        mean_toks, mean_seqs = torch.stack(valid_counts).float().mean(0).tolist()
        out["global_valid_toks"], out["global_valid_seqs"] = mean_toks, mean_seqs
        return out

    def _global_batch(self, gb: slice, token_mask, sample_mask, plan, max_grad_norm, forward, loss, batch,
                      metrics_per_mb, eval_mode) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rows ``gb``: their micro-batches, then (unless ``eval_mode``) sync, clip and step. Returns the global
        (valid tokens, valid seqs) and the grad norm (None in ``eval_mode``)."""
        tm = token_mask[gb].float() * sample_mask[gb, None]
        counts = self.rank.all_reduce(torch.stack([tm.sum(), sample_mask[gb].sum()]))
        global_toks, global_seqs = counts[0], counts[1]
        if not eval_mode:
            self.optimizer.zero_grad(set_to_none=True)
        # The weights hold still until the optimizer step: each is cast to bf16 once for all micro-batches.
        with weight_casts_kept(self.model), matmul_attention_backward(self.model):
            for mb in plan(torch.arange(len(token_mask), device=token_mask.device)[gb]):
                value, m = loss(forward(mb), {k: v[mb.rows] for k, v in batch.items()}, sample_mask[mb.rows],
                                global_toks, global_seqs)
                if not eval_mode:
                    value.backward()
                metrics_per_mb.append({"loss": value.detach(), **{k: v.detach() for k, v in m.items()}})
        if eval_mode:
            return counts, None
        if self.sparse_embedding:
            densify_embedding_grad(self.model)
        parallel.sync_gradients(self.model, self.rank.group)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_grad_norm if max_grad_norm else math.inf)
        self.optimizer.step()
        return counts, parallel.as_float(norm)

    def apply_optimizer_settings(self, lr: float, weight_decay: float, betas: list[float], eps: float) -> None:
        """After a resume: the run's optimizer settings replace the restored ones; lr follows the restored schedule."""
        groups = self.optimizer.param_groups
        for g in groups:
            g.update(initial_lr=lr, weight_decay=weight_decay, betas=tuple(betas), eps=eps)
        self.scheduler.base_lrs = [lr] * len(groups)
        for g, factor in zip(groups, (f(self.scheduler.last_epoch) for f in self.scheduler.lr_lambdas)):
            g["lr"] = lr * factor
        self.scheduler._last_lr = [g["lr"] for g in groups]

    # ---- checkpoints
    def save(self, path: str, tokenizer, frozen: dict[str, torch.nn.Module]) -> None:
        """HF weights + ``tokenizer`` to ``path/weights``, optimizer/scheduler and ``frozen`` state to
        ``path/optimizer.pt`` (rank 0; under FSDP each rank writes its optimizer shard)."""
        weights_dir = os.path.join(path, "weights")
        if parallel.is_sharded(self.model):
            weights = parallel.full_state_dict(self.model)
            if self.rank.rank == 0:
                self.model.save_pretrained(weights_dir, state_dict=weights, safe_serialization=True)
                tokenizer.save_pretrained(weights_dir)
                torch.save({"scheduler": self.scheduler.state_dict()}, os.path.join(path, "scheduler.pt"))
            return parallel.save_sharded_state(path, self.model, self.optimizer, frozen)
        if self.rank.rank != 0:
            return
        self.model.save_pretrained(weights_dir, safe_serialization=True)
        tokenizer.save_pretrained(weights_dir)
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        state.update({name: m.state_dict() for name, m in frozen.items()})
        torch.save(state, os.path.join(path, "optimizer.pt"))

    def load(self, path: str, load_weights: Callable[[str], None], frozen: dict[str, torch.nn.Module]) -> None:
        """Resume what :meth:`save` wrote; ``load_weights`` knows their kind (full or LoRA adapter)."""
        from rlplane.utils.checkpoint import load_torch_state

        parallel.check_resume_layout(path, self.rank.world_size, parallel.is_sharded(self.model))
        load_weights(os.path.join(path, "weights"))
        if parallel.is_sharded(self.model):
            parallel.load_sharded_state(path, self.model, self.optimizer, frozen)
            state = load_torch_state(os.path.join(path, "scheduler.pt"))
            return self.scheduler.load_state_dict(state["scheduler"])
        state = load_torch_state(os.path.join(path, "optimizer.pt"))
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        for name, m in frozen.items():
            if name in state:
                m.load_state_dict(state[name])
