"""Training samples as text with rewards and advantages, decoded from the step's ``input_ids`` so they
line up with the driver's carry after dynamic sampling."""

from __future__ import annotations

import torch

from rlplane.dataplane import KVBatchMeta


def train_samples(s, meta: KVBatchMeta, carry: dict[str, torch.Tensor], advantages: torch.Tensor,
                  partition_id: str) -> list[dict]:
    """One row per sample: prompt, completion (every token after the prompt), shaped reward, advantage, group."""
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
