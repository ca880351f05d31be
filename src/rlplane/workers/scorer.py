"""The scorer block: per-token logprobs of a DP shard under a frozen model (reference or teacher), written
back into the data plane. The reference's are temperature-only, as in NeMo RL. Also a teacher's top-k logits."""

from __future__ import annotations

import torch

from rlplane.dataplane import KVBatchMeta
from rlplane.dataplane.columns import INPUT_IDS, TOKEN_MASK
from rlplane.models.precision import autocast, weight_casts_kept
from rlplane.workers import shared_prefix
from rlplane.workers.logprobs import microbatch_logprobs
from rlplane.workers.packing import forward_microbatch, microbatch_planner
from rlplane.workers.rank import DPRank


@torch.no_grad()
def shard_logprobs(rank: DPRank, model: torch.nn.Module, meta: KVBatchMeta, out_field: str, policy, pad_id: int,
                   filtered: bool, micro_batch_size: int | None = None) -> KVBatchMeta | None:
    """No-grad (eval mode) logprobs of ``rank``'s shard written back as ``out_field``: ``policy.generation``'s
    distribution with ``filtered``, else temperature only; ``micro_batch_size`` (None: ``logprob_batch_size``)."""
    lengths = rank.lengths(meta)
    plan = microbatch_planner(policy, train=False, size=micro_batch_size)(torch.arange(len(meta), device=rank.device),
                                                                         lengths)
    finish_lockstep = rank.lockstep(model, len(plan))
    if len(meta) == 0:
        return finish_lockstep()
    # shared_prefix_forward here too, so a prev forward of the trained weights gives a ratio of exactly 1.
    shared = shared_prefix.applies(policy)
    data = rank.fetch(meta, [INPUT_IDS, TOKEN_MASK] if shared else [INPUT_IDS])
    ids = data[INPUT_IDS]  # (B, T)
    prompts = shared_prefix.prompt_lengths(data[TOKEN_MASK], lengths) if shared else None
    gen = policy.generation
    top_k, top_p = (gen.top_k, gen.top_p) if filtered else (None, 1.0)
    trim = policy.dynamic_batching.enabled
    was_training = model.training
    model.eval()
    out = torch.zeros(ids.shape, dtype=torch.float32, device=rank.device)  # (B, T)
    with weight_casts_kept(model):  # bf16 weights cast once for the shard
        for mb in plan:
            out[mb.rows] = microbatch_logprobs(model, ids, lengths, mb, trim, gen.temperature, top_k, top_p,
                                               prompt_lens=prompts, pad_id=pad_id)
    out = out.cpu()  # the data plane holds host tensors
    finish_lockstep()
    model.train(was_training)
    return rank.put_rows(meta, out_field, out, lengths)


@torch.no_grad()
def shard_topk_logits(rank: DPRank, model: torch.nn.Module, meta: KVBatchMeta, out_fields: tuple[str, str], policy,
                      k: int) -> KVBatchMeta | None:
    """The k largest logits over the temperature (and their token ids) of the distribution of every token of
    ``rank``'s shard, written back as ``out_fields`` (values, ids): (T, k) per sample, row t for token t (from the
    logits at t − 1), row 0 zeros. No-grad, eval mode, ``policy.logprob_batch_size`` micro-batches."""
    lengths = rank.lengths(meta)
    plan = microbatch_planner(policy, train=False)(torch.arange(len(meta), device=rank.device), lengths)
    finish_lockstep = rank.lockstep(model, len(plan))
    if len(meta) == 0:
        return finish_lockstep()
    ids = rank.fetch(meta, [INPUT_IDS])[INPUT_IDS]  # (B, T)
    temperature = policy.generation.temperature
    was_training = model.training
    model.eval()
    width = min(k, model.config.vocab_size)
    values = torch.zeros((*ids.shape, width), dtype=torch.float32)  # (B, T, k) on the host, as the plane holds them
    tokens = torch.zeros((*ids.shape, width), dtype=torch.long)
    for mb in plan:
        with autocast(model):
            logits, _ = forward_microbatch(model, ids, lengths, mb, policy.dynamic_batching.enabled)  # (b, L, V)
        top = torch.topk(logits[:, :-1].float() / temperature, width, dim=-1)  # (b, L-1, k): for tokens 1..L-1
        span = top.values.shape[1]
        values[mb.rows.cpu(), 1 : span + 1] = top.values.cpu()
        tokens[mb.rows.cpu(), 1 : span + 1] = top.indices.cpu()
    finish_lockstep()
    model.train(was_training)
    cut = lengths.cpu()
    return rank.dp.put_samples(list(meta.sample_ids), meta.partition_id,
                               {out_fields[0]: [values[i, : cut[i]] for i in range(len(values))],
                                out_fields[1]: [tokens[i, : cut[i]] for i in range(len(tokens))]})


class Scorer:
    """A frozen ``model`` (eval, no gradients) writing logprobs of ``rank``'s shards, filtered or not."""

    def __init__(self, model: torch.nn.Module, rank: DPRank, policy, pad_id: int, filtered: bool):
        self.model = model.to(rank.device).eval().requires_grad_(False)
        self.rank, self.policy, self.pad_id, self.filtered = rank, policy, pad_id, filtered

    def write_logprobs(self, meta: KVBatchMeta, out_field: str, micro_batch_size: int | None = None
                       ) -> KVBatchMeta | None:
        return shard_logprobs(self.rank, self.model, meta, out_field, self.policy, self.pad_id, self.filtered,
                              micro_batch_size)
