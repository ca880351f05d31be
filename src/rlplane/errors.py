"""Errors a user can cause, shared across the package: the ground floor every part may import.

A user's mistake is a one-line message (what is wrong, where, how to fix it), never a traceback;
the command line prints ``str(err)`` and exits.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A user's config is wrong. ``str(err)`` is one line per problem, each naming its dotted path."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))
