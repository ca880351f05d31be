"""Training and validation samples as text, decoded from their columns in the data plane (training ones
line up with the driver's carry after dynamic sampling; NeMo RL's validation reads the plane too)."""

from __future__ import annotations

import torch

from rlplane.dataplane import KVBatchMeta
from rlplane.dataplane.columns import INPUT_IDS, TOKEN_MASK


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


def val_samples(data_plane, meta: KVBatchMeta, carry: dict[str, torch.Tensor], datums: list, tokenizer) -> list[dict]:
    """One row per greedy validation sample (one per datum): task, prompt, completion, reward, reference
    answer. The completion is every token after the prompt: generated stretches as text, observation
    stretches (``token_mask`` 0) on lines of their own tagged ``[observation]``."""
    cols = data_plane.get_samples(meta, meta.partition_id, [INPUT_IDS, TOKEN_MASK])
    rows = []
    for i, (d, n, p) in enumerate(zip(datums, meta.seq_lens, carry["prompt_lengths"].tolist())):
        ids, mask = cols[INPUT_IDS][i, :n].tolist(), cols[TOKEN_MASK][i, :n].tolist()
        parts, start = [], p
        for t in range(p + 1, n + 1):  # cut where the mask changes: generated vs observation stretches
            if t == n or mask[t] != mask[start]:
                text = tokenizer.decode(ids[start:t], skip_special_tokens=True)
                parts.append(text if mask[start] else f"[observation] {text}")
                start = t
        rows.append({"task_name": d.task_name, "prompt": tokenizer.decode(ids[:p], skip_special_tokens=True),
                     "completion": "\n".join(parts), "reward": float(carry["rewards"][i]),
                     "ground_truth": d.ground_truth})
    return rows
