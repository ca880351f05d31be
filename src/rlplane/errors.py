"""Errors a user can cause: the ground floor every part may import; the command line prints ``str(err)``."""

from __future__ import annotations


class ConfigError(ValueError):
    """A user's config is wrong. ``str(err)`` is one line per problem, each naming its dotted path."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


class WorkerFailed(RuntimeError):
    """A worker died, hung past the watchdog or returned garbage: one line naming it; the run stops."""


class TrainingInterrupted(RuntimeError):
    """SIGINT, SIGTERM or SIGHUP stopped the run at a step boundary (one line; ``signum``: the signal)."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum
