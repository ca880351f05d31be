"""What the policy and value workers share: optimizer and schedule, the DP group (plain or FSDP2,
:mod:`rlplane.workers.parallel`), shard fetches onto the worker's device, and the global-batch
training loop (micro-batches → summed gradients → all-reduce → clip → AdamW).

Both workers are plain classes (``runtime: local``) that Ray wraps as actors (``runtime: ray``); the
methods here are the ones the runtime calls on either (``setup_distributed``, ``node_address``, ``ping``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from rlplane.config.policy import OptimizerConfig, SchedulerConfig
from rlplane.dataplane import DataPlaneClient, KVBatchMeta
from rlplane.fast.threads import set_worker_threads
from rlplane.models.loading import load_policy
from rlplane.models.precision import apply_precision
from rlplane.runtime.devices import resolve_device, to_device
from rlplane.runtime.shared_paths import SharedPaths, check_shared_paths
from rlplane.utils.metrics import reduce_microbatch_metrics
from rlplane.workers import parallel
from rlplane.workers.packing import MicroBatch

# (model output of the micro-batch, its rows of the batch, its sample mask, global valid tokens, global valid
# sequences) -> (loss, detached metrics)
MicroBatchLoss = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]


def load_configured_policy(cfg, trainable: bool = False, init_state: dict[str, torch.Tensor] | None = None):
    """``(model, tokenizer)`` for ``policy.model_name``: the embedded model takes its shape from
    ``policy.tiny``; initialisation is seeded by the run's seed. ``policy.attn_implementation``,
    ``policy.precision`` and ``policy.activation_checkpointing`` are applied to the model. ``init_state``
    (full weights, HF names) is loaded first; with ``trainable`` and ``policy.lora.enabled`` the model is then wrapped
    in LoRA adapters (``models/lora.py``): the trainer's copy, never a generator's."""
    p = cfg.policy
    embedded = p.model_name.startswith("embedded:")
    model, tokenizer = load_policy(p.model_name, seed=cfg.loop.seed,
                                   model_kwargs=p.tiny.model_dump() if embedded else None)
    if init_state is not None:
        model.load_state_dict(init_state)
    if p.attn_implementation is not None:
        model.set_attn_implementation(p.attn_implementation)
    apply_precision(model, p.precision)
    if trainable and p.lora.enabled:
        from rlplane.models.lora import apply_lora

        model = apply_lora(model, p.lora.rank, p.lora.alpha, p.lora.target_modules, p.lora.dropout)
    if p.activation_checkpointing:
        # Non-reentrant: works with inputs that do not require grad and with autocast.
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, tokenizer


def _lr_lambda(warmup_steps: int, start_factor: float):
    def f(step: int) -> float:
        if warmup_steps <= 0 or step >= warmup_steps:
            return 1.0
        return start_factor + (1.0 - start_factor) * step / warmup_steps

    return f


def build_optimizer(model: torch.nn.Module, opt: OptimizerConfig, sch: SchedulerConfig):
    """AdamW over ``model``'s trainable parameters (the adapters only, under LoRA) and a LambdaLR with
    linear warm-up; ``(optimizer, scheduler)``."""
    # foreach: one op per update term over all tensors. torch picks it by default only on GPUs; on a
    # CPU it is the same kernels on each tensor (same numbers) without a Python loop over the parameters.
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=opt.lr, weight_decay=opt.weight_decay,
        betas=tuple(opt.betas), eps=opt.eps, foreach=True
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(sch.warmup_steps, sch.warmup_start_factor))
    return optimizer, scheduler


class DPTrainWorker:
    """Base of the trainable workers. Subclasses set ``cfg``, ``dp``, ``rank``, ``world_size``,
    ``device``, ``model`` (on ``device``), ``optimizer``, ``scheduler`` and ``group = None`` in their
    constructor; ``frozen_models`` names the models sharded alongside ``model`` without training."""

    cfg: object
    device: torch.device
    dp: DataPlaneClient | None
    rank: int
    world_size: int
    group: object | None
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler

    def _start(self, role: str, cfg, data_plane: DataPlaneClient | None, rank: int, world_size: int,
               shared_paths: SharedPaths | None) -> None:
        """The first lines of every rank's constructor: on another node, a run directory or model this
        worker cannot see is one line naming ``role``, not a traceback; then its rank, threads and device."""
        check_shared_paths(shared_paths, role, cfg.policy.model_name)
        self.cfg, self.dp, self.rank, self.world_size = cfg, data_plane, rank, world_size
        set_worker_threads(cfg.policy.threads_per_worker)
        self.device = resolve_device(cfg.policy.device)

    # ---- data parallelism ------------------------------------------------------------------------
    def frozen_models(self) -> dict[str, torch.nn.Module]:
        return {}

    def setup_distributed(self, address: str) -> None:
        """Join the group of all DP ranks (NCCL on CUDA, gloo on CPU; called on every rank at once,
        blocks until all join); with ``policy.dtensor_cfg.enabled`` shard the models with FSDP2."""
        self.group = parallel.init_dp_group(address, self.rank, self.world_size, self.device)
        if self.cfg.policy.dtensor_cfg.enabled:
            self.shard_models()

    def shard_models(self) -> None:
        """FSDP2-shard the trained and frozen models over the joined group; the optimizer is rebuilt
        over the shards (before any step, so nothing is lost)."""
        for m in (self.model, *self.frozen_models().values()):
            parallel.shard_model(m, self.device, self.world_size)
        self.optimizer, self.scheduler = parallel.rebuild_optimizer(self.model, self.optimizer, self.scheduler)

    def _all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if self.group is None:
            return t
        import torch.distributed as dist

        dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op])
        return t

    def apply_optimizer_settings(self, lr: float, weight_decay: float, betas: list[float], eps: float) -> None:
        """After a resume: the run's optimizer settings replace the saved ones that loading the optimizer
        and scheduler state restored; the learning rate follows the schedule from its restored step."""
        groups = self.optimizer.param_groups
        for g in groups:
            g.update(initial_lr=lr, weight_decay=weight_decay, betas=tuple(betas), eps=eps)
        self.scheduler.base_lrs = [lr] * len(groups)
        for g, factor in zip(groups, (f(self.scheduler.last_epoch) for f in self.scheduler.lr_lambdas)):
            g["lr"] = lr * factor
        self.scheduler._last_lr = [g["lr"] for g in groups]

    def ping(self) -> int:
        return self.rank

    def placement(self) -> dict:
        """Under Ray: the node, placement group and bundle this actor runs in."""
        from rlplane.runtime.placement import current_placement

        return current_placement()

    def node_address(self) -> str:
        import socket

        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"{ip}:{port}"

    # ---- data ------------------------------------------------------------------------------------
    def _fetch(self, meta: KVBatchMeta, fields: list[str]) -> dict[str, torch.Tensor]:
        """This rank's shard of ``fields``, padded to the step's common length (all ranks alike)."""
        pad_to = meta.extra_info.get("global_forward_pad_seqlen")
        host = self.dp.get_samples(meta, meta.partition_id, fields, pad_to=pad_to)  # pads: columns.py
        return to_device(host, self.device)

    def _lockstep(self, model: torch.nn.Module, num_local: int):
        """Under FSDP (whose forwards are collectives), a callable that runs the no-op forwards this
        rank owes after its shard's ``num_local`` no-grad forwards, so every rank runs as many as the
        busiest. Call it before the first forward: agreeing on the count is itself a collective."""
        extra = parallel.extra_forward_rounds(num_local, model, self.group, self.device)

        def finish() -> None:
            for _ in range(extra):
                parallel.noop_forward(model, self.device)

        return finish

    # ---- training --------------------------------------------------------------------------------
    def _train_global_batches(
        self,
        token_mask: torch.Tensor,
        sample_mask: torch.Tensor,
        global_batch_size: int,
        plan: Callable[[torch.Tensor], list[MicroBatch]],
        max_grad_norm: float | None,
        forward: Callable[[MicroBatch], torch.Tensor],
        loss: MicroBatchLoss,
        batch: dict[str, torch.Tensor],
    ) -> dict[str, float]:
        """One optimizer step per global batch of this rank's shard, then one scheduler step.

        ``token_mask`` (B, T') is the loss's token mask (already sliced like the loss inputs) and
        ``sample_mask`` (B,). ``plan(rows)`` cuts a global batch's rows into micro-batches
        (``workers/packing.py``); per micro-batch ``mb``: ``loss(forward(mb), {k: v[mb.rows]},
        sample_mask[mb.rows], global_valid_tokens, global_valid_seqs)``, ``forward`` returning (b, T') rows.
        The loss is normalised by the global counts of each global batch (summed over micro-batches and
        DP ranks), so the summed gradient is the global-batch mean, however the rows are cut.
        Returns the reduced metrics plus ``grad_norm``, ``lr``, ``global_valid_toks/seqs``.
        """
        per_rank_gbs = global_batch_size // self.world_size
        num_gb = max(1, len(token_mask) // per_rank_gbs)
        metrics_per_mb: list[dict[str, torch.Tensor]] = []
        grad_norms, valid_counts = [], []
        for g in range(num_gb):
            gb = slice(g * per_rank_gbs, (g + 1) * per_rank_gbs)
            tm = token_mask[gb].float() * sample_mask[gb, None]
            counts = self._all_reduce(torch.stack([tm.sum(), sample_mask[gb].sum()]))
            global_toks, global_seqs = counts[0], counts[1]
            valid_counts.append(counts)
            self.optimizer.zero_grad(set_to_none=True)
            for mb in plan(torch.arange(len(token_mask), device=token_mask.device)[gb]):
                value, m = loss(forward(mb), {k: v[mb.rows] for k, v in batch.items()}, sample_mask[mb.rows],
                                global_toks, global_seqs)
                value.backward()
                metrics_per_mb.append({"loss": value.detach(), **{k: v.detach() for k, v in m.items()}})
            parallel.sync_gradients(self.model, self.group)
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_grad_norm if max_grad_norm else math.inf)
            grad_norms.append(parallel.as_float(norm))
            self.optimizer.step()
        self.scheduler.step()
        out = reduce_microbatch_metrics(metrics_per_mb, num_global_batches=num_gb)
        out["grad_norm"] = float(torch.stack(grad_norms).mean())
        out["lr"] = self.optimizer.param_groups[0]["lr"]
        # Mean over the step's global batches, as grad_norm (NeMo RL reports their mean too).
        mean_toks, mean_seqs = torch.stack(valid_counts).float().mean(0).tolist()
        out["global_valid_toks"], out["global_valid_seqs"] = mean_toks, mean_seqs
        return out
