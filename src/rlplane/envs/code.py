"""Code execution: the model's Python (the last fenced block, or the whole response) runs in the sandbox
followed by ``metadata["tests"]``; it passes when both ran to their end with exit 0 within the limits.
``num_workers`` at a time; refuses to start without isolation. ``max_attempts > 1`` feeds back the error.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from rlplane.data.datum import Message
from rlplane.envs.interface import Environment, EnvironmentReturn, last_assistant_content
from rlplane.envs.registry import UnknownEnvironmentError
from rlplane.envs.sandbox import SandboxLimits, SandboxResult, SandboxUnavailable, check_isolation, run_python

_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def extract_code(response: str) -> str:
    """The last fenced code block of ``response``, else the response itself."""
    blocks = _FENCE.findall(response)
    return blocks[-1] if blocks else response


def failure_summary(result: SandboxResult) -> str:
    """One line saying why a run failed (the exception's last line, the signal, or the timeout)."""
    if result.timed_out:
        return "timed out"
    if result.killed_by:
        return f"killed by {result.killed_by}"
    lines = [ln for ln in result.stderr.strip().splitlines() if ln.strip()]
    if lines:
        return lines[-1][:200]
    if result.returncode == 0 and not result.completed:
        return "exited before the tests finished"
    return f"exit status {result.returncode}"


def tests_of(metadata: dict[str, Any]) -> str:
    """The sample's tests: ``metadata["tests"]``, else its ground truth (a JSONL row's answer field)."""
    tests = metadata.get("tests", metadata.get("ground_truth"))
    if not tests:
        raise ValueError("code sample without tests: give metadata['tests'] (or the answer field of a JSONL row)")
    return str(tests)


class CodeEnv(Environment):
    """Reward 1.0 when the response's code passes ``metadata["tests"]`` in the sandbox, else 0.0."""

    def __init__(
        self,
        cpu_seconds: float = 2.0,
        wall_seconds: float = 5.0,
        memory_mb: int = 512,
        output_kb: int = 64,
        num_workers: int = 2,
        max_attempts: int = 1,
    ):
        self.limits = SandboxLimits(cpu_seconds=cpu_seconds, wall_seconds=wall_seconds,
                                    memory_bytes=memory_mb * 2**20, output_bytes=output_kb * 2**10)
        self.num_workers = max(1, num_workers)
        self.max_attempts = max(1, max_attempts)
        try:
            self.isolation = check_isolation()  # fail closed, before any model code exists
        except SandboxUnavailable as e:
            raise UnknownEnvironmentError(f"task_name 'code': {e}") from None

    def run(self, codes: Sequence[str], tests: Sequence[str]) -> list[SandboxResult]:
        """Each code, then its tests, in its own sandbox; ``num_workers`` at a time."""
        with ThreadPoolExecutor(self.num_workers) as pool:
            return list(pool.map(lambda c, t: run_python(c, self.limits, tests=t), codes, tests))

    def step(self, message_logs: Sequence[list[Message]], metadata: Sequence[dict[str, Any]]) -> EnvironmentReturn:
        if len(message_logs) != len(metadata):
            raise ValueError(f"CodeEnv.step: {len(message_logs)} message logs for {len(metadata)} metadata")
        codes = [extract_code(last_assistant_content(log)) for log in message_logs]
        results = self.run(codes, [tests_of(m) for m in metadata])
        passed = [r.ok for r in results]
        attempts = [int(m.get("attempt", 0)) + 1 for m in metadata]
        done = [p or a >= self.max_attempts for p, a in zip(passed, attempts)]
        observations = [
            {"role": "environment", "content": "passed" if p else f"failed: {failure_summary(r)}"}
            for p, r in zip(passed, results)
        ]
        return EnvironmentReturn(
            observations=observations,
            metadata=[{**m, "attempt": a} for m, a in zip(metadata, attempts)],
            next_stop_strings=[None] * len(codes),
            rewards=torch.tensor([float(p) for p in passed], dtype=torch.float32),
            terminateds=torch.tensor(done, dtype=torch.bool),
            answers=codes,
        )
