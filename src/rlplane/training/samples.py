"""What the model wrote: training samples as text, with their rewards and advantages.

Validation samples come from the rollout worker (:meth:`RolloutWorker.last_samples`); training
samples are decoded here from the step's ``input_ids`` in the data plane, so they line up with the
driver's (B,) carry and advantages after dynamic sampling. Both go to ``logs/samples.jsonl``
through :meth:`Session.log` (``logger.log_train_samples_every``, ``logger.num_val_samples_to_print``).
"""

from __future__ import annotations

import torch

from rlplane.dataplane import KVBatchMeta


def train_samples(s, meta: KVBatchMeta, carry: dict[str, torch.Tensor], advantages: torch.Tensor,
                  partition_id: str) -> list[dict]:
    """One row per sample of the step: prompt, completion (every generated and observation token
    after the prompt), shaped reward, advantage and prompt group."""
    ids = s.data_plane.get_samples(meta, partition_id, ["input_ids"])["input_ids"]  # (B, T) padded
    tok = s.tokenizer
    rows = []
    for i, (n, p) in enumerate(zip(meta.seq_lens, carry["prompt_lengths"].tolist())):
        row = ids[i, :n].tolist()
        rows.append({
            "group": int(carry["group"][i]),
            "prompt": tok.decode(row[:p], skip_special_tokens=True),
            "completion": tok.decode(row[p:], skip_special_tokens=True),
            "reward": float(carry["rewards"][i]),
            "advantage": float(advantages[i]),
        })
    return rows
