"""One sample's conversation during a rollout: its token columns and its message log."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class SampleState:
    """One sample's conversation so far, as token columns and as a message log."""

    input_ids: list[int]
    prompt_length: int
    message_log: list[dict[str, Any]]
    env_info: Any
    task_name: str
    stop_strings: list[str] | None
    token_mask: list[torch.Tensor] = field(default_factory=list)  # chunks, int8
    logprobs: list[torch.Tensor] = field(default_factory=list)  # chunks, float32
    versions: list[torch.Tensor] = field(default_factory=list)  # chunks, long: weight version, -1 off the mask
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)  # summed over turns like reward
    turns: int = 0
    gen_tokens: int = 0
    env_tokens: int = 0
    finish_reason: str | None = None
    done: bool = False
    terminated: bool = False
    truncated: bool = False  # the sequence hit max_total_sequence_length
    env_error: bool = False

    def append(self, ids: Sequence[int], generated: torch.Tensor | None, versions: torch.Tensor | None = None) -> None:
        """Add ``ids``; ``generated``: their logprobs (None for observations); ``versions``: their weight versions."""
        n = len(ids)
        self.input_ids.extend(ids)
        if generated is None:
            self.token_mask.append(torch.zeros(n, dtype=torch.int8))
            self.logprobs.append(torch.zeros(n))
            self.versions.append(torch.full((n,), -1, dtype=torch.long))
            self.env_tokens += n
        else:
            self.token_mask.append(torch.ones(n, dtype=torch.int8))
            self.logprobs.append(generated.float())
            self.versions.append(torch.full((n,), -1, dtype=torch.long) if versions is None else versions.long())
            self.gen_tokens += n
