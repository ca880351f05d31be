"""Verified weight sync, the driver's half: after the policy's weights change, each generator's report
is compared with the trainer's (versions before and after, fingerprint, probe; docs/weight_sync.md).
``fail`` raises :class:`WeightSyncError` (one line), ``warn`` says the line and goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from rlplane.models.fingerprint import difference
from rlplane.training.loop import TrainingStopped
from rlplane.workers.policy import PolicyWorker
from rlplane.workers.weight_sync import GeneratorReport, probe_error, tolerance


class WeightSyncError(TrainingStopped):
    """A generator does not hold the weights the trainer sent (one line)."""


def _version(v) -> str:
    return "none" if v is None else str(v)


def _weights(version, fingerprint, shared: bool) -> str:
    if shared:
        return "the policy's own module"
    return f"version {_version(version)} (fingerprint {fingerprint.digest if fingerprint is not None else 'none'})"


@dataclass(frozen=True)
class WeightCheckOptions:
    """``policy.generation.verify_weights`` (``fail`` | ``warn`` | ``off``) and ``verify_probe_every``, as the run
    plan read them (the policy ranks fingerprint what they send only when the check is on)."""

    mode: str
    probe_every: int | None

    @property
    def enabled(self) -> bool:
        return self.mode != "off"


class WeightCheck:
    """``options``: the run plan's :class:`WeightCheckOptions`; ``say``: where ``warn`` mode's lines go; ``label``
    names the generators in them, ``prefix`` starts the names of the metrics."""

    def __init__(self, options: WeightCheckOptions, say: Callable[[str], None] = print, label: str = "generator",
                 prefix: str = "weight_sync/"):
        self.mode, self.probe_every, self.say = options.mode, options.probe_every, say
        self.label, self.prefix = label, prefix
        self.verified: dict[int, int | None] = {}  # generator -> the version last verified there
        # Per weight version checked: a step's row gets those of the versions it used, whenever they were checked
        # (a resumed run's rows then equal an uninterrupted run's). Seconds spent: with the next row.
        self.metrics: dict[int, dict[str, float]] = {}
        self.seconds = 0.0

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    def run(self, reports: Callable[[bool], list[GeneratorReport]], policy, version: int, *, shared: bool = False,
            sharded: bool = False, probe: bool = True) -> None:
        """Check every generator after weights of ``version`` reached them. ``reports(probe, fingerprint)``:
        their reports; ``shared``: they sample from the policy's own module; ``sharded``: FSDP (every rank
        scores the probe); ``probe``: False where none can run now (a generation in flight)."""
        t0 = time.perf_counter()
        # By version, not by count: a resumed run probes at the same steps as an uninterrupted one.
        probe = probe and bool(self.probe_every) and version % self.probe_every == 0
        if shared and not probe:  # nothing was copied: the probe is all there is to check
            return
        got = reports(probe, not shared)
        probes = [r.probe[:2] for r in got if r.probe is not None]
        if sharded:
            trainer = policy.run(PolicyWorker.weight_check, probes, shared=shared)[0]
        else:
            trainer = policy.wait([policy.lazy(PolicyWorker.weight_check, probes, shared=shared)])[0]
        scores = iter(trainer["probe_logprobs"])
        errors = []
        for i, r in enumerate(got):
            err = probe_error(r.probe[2], next(scores)) if r.probe is not None else None
            if err is not None:
                errors.append(err)
            problem = self._problem(i, r, trainer, version, shared, err)
            if problem is not None:
                self._mismatch(i, len(got), r, trainer, version, shared, problem)
            self.verified[i] = r.version  # what it holds, right or not: a later refit compares with it
        if errors:
            m = self.metrics.setdefault(version, {})
            key = f"{self.prefix}probe_token_mult_prob_error"
            m[key] = max(m.get(key, 1.0), *errors)
        self.seconds += time.perf_counter() - t0

    def _problem(self, i: int, r: GeneratorReport, trainer: dict, version: int, shared: bool,
                 err: float | None) -> str | None:
        if not shared:
            if r.previous_version != self.verified.get(i):
                return (f"it held version {_version(r.previous_version)} before this refit, not the "
                        f"{_version(self.verified.get(i))} verified last (restarted, or its weights replaced)")
            if r.version != version:
                return "the refit did not reach it"
            if trainer["fingerprint"] is None:
                return "the trainer has no fingerprint of what it sent"
            if diff := difference(trainer["fingerprint"], r.fingerprint):
                return diff
        if err is not None:
            tol = tolerance(r.precision, trainer["precision"])
            if not err <= tol:  # NaN fails too
                return f"probe token_mult_prob_error {err:.6g} > {tol:g} ({r.precision} / {trainer['precision']})"
        return None

    def _mismatch(self, i: int, n: int, r: GeneratorReport, trainer: dict, version: int, shared: bool,
                  problem: str) -> None:
        held, sent = (r.version, r.fingerprint), (version, trainer["fingerprint"])
        line = (f"weight sync: {self.label} {i} of {n} holds {_weights(*held, shared)}, the trainer is at "
                f"{_weights(*sent, False)}: {problem}")
        m, key = self.metrics.setdefault(version, {}), f"{self.prefix}mismatches"
        m[key] = m.get(key, 0.0) + 1
        if self.mode == "fail":
            raise WeightSyncError(f"{line}; policy.generation.verify_weights=warn goes on regardless")
        self.say(line)

    def take_metrics(self, upto: int) -> dict[str, float]:
        """The metrics of the versions up to ``upto`` (dropped here), and the checks' seconds since the last call."""
        out: dict[str, float] = {}
        for v in sorted(v for v in self.metrics if v <= upto):
            for k, x in self.metrics.pop(v).items():
                out[k] = max(out.get(k, x), x) if k.endswith("prob_error") else out.get(k, 0.0) + x
        if self.seconds:
            out[f"timing/{self.prefix}check"], self.seconds = self.seconds, 0.0
        return out
