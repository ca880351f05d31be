"""A weight-sync check's worker halves: a generator's report (version, fingerprint, a probe of
``PROBE_TOKENS`` greedy tokens after ``PROBE_TEXT``) and the trainer's score of the probe's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlplane.models.fingerprint import Fingerprint
from rlplane.workers.logprobs import token_logprobs

PROBE_TEXT = "12+34="
PROBE_TOKENS = 2
# Largest probe token_mult_prob_error accepted, by the coarser precision of trainer and generator. fp32:
# the two forwards differ by float rounding only (1.000003 measured on sampled tokens). bf16 matmuls
# (fp32 lm_head): 1.014-1.016 measured on sampled tokens, the probe's greedy tokens sit lower.
PROBE_TOLERANCE = {"fp32": 1.001, "bf16": 1.05}


@dataclass(frozen=True)
class GeneratorReport:
    """What a generator holds after a refit; ``probe``: (prompt ids, generated ids, their logprobs)."""

    version: int | None  # None: never refit
    fingerprint: Fingerprint | None  # None: not asked (it samples from the trainer's own module)
    precision: str
    probe: tuple[list[int], list[int], torch.Tensor] | None = None  # None: not probed this time
    previous_version: int | None = None  # held before the last refit


def probe_prompt(tokenizer) -> list[int]:
    """The probe's prompt ids (at least one token)."""
    ids = list(tokenizer(PROBE_TEXT)["input_ids"])
    return ids or [tokenizer.eos_token_id or 0]


def model_precision(model) -> str:
    return "bf16" if getattr(model, "rlplane_autocast_dtype", None) is torch.bfloat16 else "fp32"


def run_probe(backend, tokenizer, generation) -> tuple[list[int], list[int], torch.Tensor]:
    """Greedy ``PROBE_TOKENS`` after the probe prompt under ``generation``'s sampling settings."""
    prompt = probe_prompt(tokenizer)
    out = backend.generate([prompt], max_new_tokens=PROBE_TOKENS, greedy=True, temperature=generation.temperature,
                           top_p=generation.top_p, top_k=generation.top_k, seed=0)
    return prompt, list(out.output_ids[0]), out.logprobs[0].float()


@torch.no_grad()
def score_probes(model, probes: Sequence[tuple[list[int], list[int]]], generation, pad_id: int) -> list[torch.Tensor]:
    """The trainer's (T_i,) logprobs of each probe's generated tokens, in one forward."""
    seqs = [list(p) + list(g) for p, g in probes]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.as_tensor(s)
        mask[i, : len(s)] = 1
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()  # no dropout: the probe draws no random numbers
    try:
        lp = token_logprobs(model, ids.to(device), mask.to(device), generation.temperature, generation.top_k,
                            generation.top_p).float().cpu()  # (N, W)
    finally:
        model.train(was_training)
    return [lp[i, len(p): len(p) + len(g)] for i, (p, g) in enumerate(probes)]


def probe_error(generator_logprobs: torch.Tensor, trainer_logprobs: torch.Tensor) -> float:
    """``token_mult_prob_error``: mean of exp(|generator - trainer|) over the tokens; 1 = equal."""
    if generator_logprobs.numel() == 0:
        return 1.0
    return float(torch.exp((generator_logprobs.float() - trainer_logprobs.float()).abs()).mean())


def tolerance(*precisions: str) -> float:
    return max(PROBE_TOLERANCE[p] for p in precisions)
