"""The turn loop of a rollout: generate, step the environments, append their observations, repeat.

As the seeds' ``run_multi_turn_rollout``: per turn, generate for the active samples (each with its stop
strings), cut each response to the sample's room, step the environments (:mod:`rlplane.workers.env_steps`;
rewards summed over turns, failures retried then scored 0), append observations; a sample ends when
terminated, at the turn limit, or out of room (truncated). ``token_mask`` is 1 exactly on generated tokens.
Two phases (:func:`generate_turns`, :func:`score_turns`); metrics are defined in ``docs/algorithms.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlplane.data.datum import DatumSpec
from rlplane.generation.interface import FINISH_LENGTH, GenerationBackend
from rlplane.runtime.deadlines import call_with_deadline
from rlplane.workers.env_steps import EnvSteps, step_envs
from rlplane.workers.sample_state import SampleState


@dataclass
class TurnsResult:
    """Per sample, in input order: the token columns and the rollout's outcome."""

    input_ids: list[torch.Tensor]  # (L_i,) long
    token_mask: list[torch.Tensor]  # (L_i,) int8, 1 on generated tokens
    generation_logprobs: list[torch.Tensor]  # (L_i,) float32, 0 off the mask
    generation_versions: list[torch.Tensor]  # (L_i,) long, weight version of each generated token, -1 off the mask
    rewards: torch.Tensor  # (B,) float32, summed over turns
    reward_components: dict[str, torch.Tensor]  # name -> (B,) float32, summed over turns; 0 where not given
    truncated: torch.Tensor  # (B,) bool: last response cut by a length limit, or sequence at the max length
    env_failed: torch.Tensor  # (B,) bool: its environment failed (after any retries); reward 0
    prompt_lengths: torch.Tensor  # (B,)
    response_lengths: torch.Tensor  # (B,) everything after the prompt (generated + observations)
    metrics: dict[str, float]
    states: list[SampleState]


@dataclass
class Turns:
    """A rollout between its two phases: the last turn's scoring step still due for the ``active`` samples."""

    states: list[SampleState]
    active: list[int]
    max_turns: int
    env_errors: int = 0
    env_retries: int = 0


def generate_turns(
    backend: GenerationBackend,
    tokenizer,
    datums: Sequence[DatumSpec],
    envs: EnvSteps,
    *,
    max_turns: int,
    max_total_sequence_length: int,
    max_new_tokens: int,
    stop_strings: Sequence[str] | None = None,
    row_seeds: Sequence[int] | None = None,
    generation_timeout_s: float | None = None,
    **sampling: Any,
) -> Turns:
    """Roll out ``datums`` (one sample each) up to the last turn's environment step.

    ``row_seeds`` go with their rows to every turn's call. A ``generate`` past ``generation_timeout_s``
    raises :class:`DeadlineExceeded`, which ends the run.
    """
    if max_turns < 1:
        raise ValueError(f"max_turns = {max_turns}: must be >= 1")
    max_total = max_total_sequence_length
    states = [
        SampleState(
            input_ids=list(d.prompt_token_ids), prompt_length=len(d.prompt_token_ids),
            message_log=[dict(m) for m in d.message_log],
            # A copy per sample: an env may update its state in place.
            env_info=dict(d.extra_env_info) if isinstance(d.extra_env_info, dict) else d.extra_env_info,
            task_name=d.task_name,
            stop_strings=d.stop_strings,
        )
        for d in datums
    ]
            # The prompts' chunks: views of one zero buffer per column (read only).
    longest = max((s.prompt_length for s in states), default=0)
    zero_mask, zero_logprobs = torch.zeros(longest, dtype=torch.int8), torch.zeros(longest)
    zero_versions = torch.full((longest,), -1, dtype=torch.long)  # -1: not a generated token
    for s in states:
        s.token_mask.append(zero_mask[: s.prompt_length])
        s.logprobs.append(zero_logprobs[: s.prompt_length])
        s.versions.append(zero_versions[: s.prompt_length])
        if s.prompt_length >= max_total:  # no room to generate anything
            s.done = s.truncated = True
    turns = Turns(states, [], max_turns)
    for turn in range(max_turns):
        active = [i for i, s in enumerate(states) if not s.done]
        if not active:
            break
        rooms = [max_total - len(states[i].input_ids) for i in active]
        # One generate call for all active rows, bounded by the longest room; each row is cut below.
        out = call_with_deadline(
            lambda: backend.generate(
                [states[i].input_ids for i in active],
                max_new_tokens=min(max_new_tokens, max(rooms)),
                stop_strings=_row_stop_strings(stop_strings, [states[i].stop_strings for i in active]),
                **({} if row_seeds is None else {"row_seeds": [row_seeds[i] for i in active]}),
                **sampling,
            ),
            generation_timeout_s, f"rollout worker: generation of {len(active)} samples (turn {turn + 1})",
            "policy.generation.timeout_s",
        )
        versions = out.versions or [None] * len(active)
        for i, room, ids, lps, vs, reason in zip(active, rooms, out.output_ids, out.logprobs, versions,
                                                 out.finish_reasons):
            s = states[i]
            if len(ids) > room:
                ids, lps, vs, reason = ids[:room], lps[:room], None if vs is None else vs[:room], FINISH_LENGTH
            s.append(ids, lps, vs)
            s.truncated = reason == FINISH_LENGTH and len(s.input_ids) >= max_total  # filled the sequence
            s.turns += 1
            s.finish_reason = reason
            s.message_log.append({"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True),
                                  "token_ids": list(ids), "generation_logprobs": lps})
        if turn == max_turns - 1:  # the last generate call: its environment step is the scoring
            turns.active = active
            break
        _step_turn(turns, active, envs)
        for i in active:
            s = states[i]
            if s.done:  # terminated or failed in step_envs
                continue
            room = max_total - len(s.input_ids)
            obs = s.message_log[-1].get("content", "") if s.message_log[-1].get("role") != "assistant" else ""
            obs_ids = tokenizer(obs, add_special_tokens=False)["input_ids"] if obs else []
            if len(obs_ids) + 1 > room:  # the observation and at least one more generated token must fit
                obs_ids = obs_ids[:room]
                s.done = s.truncated = True
            s.append(obs_ids, None)
    return turns


def score_turns(turns: Turns, envs: EnvSteps) -> Turns:
    """Step the environments of the last turn (the scoring) on ``turns.active``; every sample is then done."""
    active, turns.active = turns.active, []
    if active:
        _step_turn(turns, active, envs)
    for i in active:
        turns.states[i].done = True
    return turns


def _step_turn(turns: Turns, active: list[int], envs: EnvSteps) -> None:
    failed, retried = step_envs(turns.states, active, envs.env_for, envs.renew_env, envs.max_retries, envs.timeout_s,
                                envs.concurrent)
    turns.env_errors += failed
    turns.env_retries += retried


def turns_result(turns: Turns) -> TurnsResult:
    """The columns and outcome of a scored rollout (:func:`score_turns`)."""
    return _result(turns.states, turns.env_errors, turns.env_retries, turns.max_turns)


def run_turns(
    backend: GenerationBackend,
    tokenizer,
    datums: Sequence[DatumSpec],
    env_for: Callable[[str], Any],
    *,
    renew_env: Callable[[str], Any] | None = None,
    max_env_retries: int = 0,
    env_step_timeout_s: float | None = None,
    **kwargs: Any,
) -> TurnsResult:
    """:func:`generate_turns` then :func:`score_turns` for up to ``max_turns`` turns."""
    envs = EnvSteps(env_for, renew_env, max_env_retries, env_step_timeout_s)
    return turns_result(score_turns(generate_turns(backend, tokenizer, datums, envs, **kwargs), envs))


def _row_stop_strings(common: Sequence[str] | None, per_row: list[list[str] | None]):
    """The flat common list when no row has its own, else per-row lists."""
    if not any(per_row):
        return list(common) if common else common
    return [[*(common or []), *(r or [])] for r in per_row]


def _rows(flat: list, lengths: list[int], dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """Per-sample rows of ``lengths`` from all samples' values or chunks: one tensor split into views."""
    if not lengths:
        return []
    whole = torch.tensor(flat, dtype=dtype) if dtype is not None else torch.cat(flat)
    return list(whole.split(lengths))


def _result(states: list[SampleState], env_errors: int, env_retries: int, max_turns: int) -> TurnsResult:
    n = max(len(states), 1)

    def mean(xs) -> float:
        return float(sum(xs)) / n

    gen = [s.gen_tokens for s in states]
    metrics = {
        "mean_gen_tokens_per_sample": mean(gen),
        "max_gen_tokens_per_sample": float(max(gen, default=0)),
        "mean_env_tokens_per_sample": mean(s.env_tokens for s in states),
        "mean_total_tokens_per_sample": mean(len(s.input_ids) for s in states),
        "avg_turns_per_sample": mean(s.turns for s in states),
        "max_turns_per_sample": float(max((s.turns for s in states), default=0)),
        "natural_termination_rate": mean(s.terminated for s in states),
        "truncation_rate": mean(s.truncated for s in states),
        "max_turns_reached_rate": mean(
            s.turns == max_turns and not (s.terminated or s.truncated or s.env_error) for s in states
        ),
        "env_errors": float(env_errors),
        "env_error_rate": env_errors / n,
        "env_retries": float(env_retries),
    }
    prompt_lengths = torch.tensor([s.prompt_length for s in states])
    names = sorted({name for s in states for name in s.reward_components})
    lengths = [len(s.input_ids) for s in states]
    return TurnsResult(
        input_ids=_rows([t for s in states for t in s.input_ids], lengths, torch.long),
        token_mask=_rows([c for s in states for c in s.token_mask], lengths),
        generation_logprobs=_rows([c for s in states for c in s.logprobs], lengths),
        generation_versions=_rows([c for s in states for c in s.versions], lengths),
        rewards=torch.tensor([s.reward for s in states], dtype=torch.float32),
        reward_components={n: torch.tensor([s.reward_components.get(n, 0.0) for s in states], dtype=torch.float32)
                           for n in names},
        truncated=torch.tensor([s.truncated or s.finish_reason == FINISH_LENGTH for s in states]),
        env_failed=torch.tensor([s.env_error for s in states], dtype=torch.bool),
        prompt_lengths=prompt_lengths,
        response_lengths=torch.tensor([len(s.input_ids) for s in states]) - prompt_lengths,
        metrics=metrics,
        states=states,
    )
