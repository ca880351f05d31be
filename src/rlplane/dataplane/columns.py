"""Every column a training step keeps in the data plane, declared once: name, kind, dtype, pad value, writer.

``per-token`` columns are jagged (prompt + response), trimmed on write and padded on read; ``per-sample``
hold one value. Logprobs: ``column[:, t] = log π(token_t | tokens_<t)``, position 0 is 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "ADVANTAGES", "ASYNC_ROLLOUT_COLUMNS", "COLUMNS", "GENERATION_LOGPROBS", "GENERATION_VERSIONS", "INPUT_IDS",
    "PREV_LOGPROBS", "REFERENCE_LOGPROBS", "RETURNS",
    "ROLLOUT_COLUMNS", "TEACHER_LOGPROBS", "TEACHER_TOPK_INDICES", "TEACHER_TOPK_LOGITS", "TOKEN_COLUMNS", "TOKEN_MASK",
    "VALUES", "ColumnSpec", "pad_values",
]

INPUT_IDS = "input_ids"
TOKEN_MASK = "token_mask"
GENERATION_LOGPROBS = "generation_logprobs"
GENERATION_VERSIONS = "generation_versions"
PREV_LOGPROBS = "prev_logprobs"
REFERENCE_LOGPROBS = "reference_policy_logprobs"
TEACHER_LOGPROBS = "teacher_logprobs"
TEACHER_TOPK_LOGITS = "teacher_topk_logits"
TEACHER_TOPK_INDICES = "teacher_topk_indices"
ADVANTAGES = "advantages"
VALUES = "values"
RETURNS = "returns"
ROUTED_EXPERTS = "routed_experts"


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    per_token: bool
    dtype: torch.dtype
    pad: float | int
    writer: str
    doc: str


COLUMNS: dict[str, ColumnSpec] = {c.name: c for c in (
    ColumnSpec(INPUT_IDS, True, torch.long, 0, "rollout worker",
               "prompt + response token ids (multi-turn: prompt, responses and observations)"),
    ColumnSpec(TOKEN_MASK, True, torch.long, 0, "rollout worker",
               "1 on generated tokens (the ones trained on), 0 on prompt and observation tokens"),
    ColumnSpec(GENERATION_LOGPROBS, True, torch.float32, 0.0, "rollout worker",
               "logprob of each generated token under the sampler, 0 elsewhere"),
    ColumnSpec(GENERATION_VERSIONS, True, torch.long, -1, "rollout worker",
               "weight version each generated token was sampled with (in-flight weight updates change it "
               "mid-response), -1 elsewhere"),
    ColumnSpec(PREV_LOGPROBS, True, torch.float32, 0.0, "policy worker (compute_logprobs)",
               "log π_old: the policy's logprobs before this step's update"),
    ColumnSpec(REFERENCE_LOGPROBS, True, torch.float32, 0.0, "policy worker (compute_logprobs, reference=True)",
               "log π_ref of the frozen reference policy (KL penalty)"),
    ColumnSpec(TEACHER_LOGPROBS, True, torch.float32, 0.0, "teacher worker (compute_logprobs)",
               "log π_teacher of the student's tokens (on-policy distillation)"),
    ColumnSpec(TEACHER_TOPK_LOGITS, True, torch.float32, 0.0, "teacher worker (compute_topk_logits)",
               "(T, k): the teacher's k largest logits (over the temperature) for token t, position 0 zeros "
               "(on-policy distillation's top-k KL)"),
    ColumnSpec(TEACHER_TOPK_INDICES, True, torch.long, 0, "teacher worker (compute_topk_logits)",
               "(T, k): the token ids of those logits"),
    ColumnSpec(ADVANTAGES, True, torch.float32, 0.0, "driver (GRPO: per-sample value broadcast; PPO: GAE)",
               "advantage of each token"),
    ColumnSpec(VALUES, True, torch.float32, 0.0, "value worker (compute_values)",
               "V(s_t) of the critic, right-shifted: position t holds the value before token t"),
    ColumnSpec(RETURNS, True, torch.float32, 0.0, "driver (PPO: GAE)", "value targets of the critic"),
    ColumnSpec(ROUTED_EXPERTS, True, torch.long, 0, "generation backend (MoE)", "routed expert ids per token"),
)}

#: Per-token columns: stored jagged, trimmed to the sequence length on write, padded on read.
TOKEN_COLUMNS: tuple[str, ...] = tuple(name for name, c in COLUMNS.items() if c.per_token)
#: What the rollout worker writes for each sample.
ROLLOUT_COLUMNS: tuple[str, ...] = (INPUT_IDS, TOKEN_MASK, GENERATION_LOGPROBS)
#: ... plus, for async GRPO, the weight version of each token.
ASYNC_ROLLOUT_COLUMNS: tuple[str, ...] = (*ROLLOUT_COLUMNS, GENERATION_VERSIONS)


def pad_values(names) -> dict[str, float | int]:
    """The declared pad value of each of ``names`` (0 for a column not declared here)."""
    return {n: COLUMNS[n].pad if n in COLUMNS else 0 for n in names}
