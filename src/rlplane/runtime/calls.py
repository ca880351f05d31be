"""How a call names the worker method it runs: the method itself (``PolicyWorker.train``), never a string, so a
reader and every tool can follow it; its name crosses to another process here only."""

from __future__ import annotations

from collections.abc import Callable


def method_name(method: Callable) -> str:
    """The name ``method`` (a worker class's method, e.g. ``PolicyWorker.train``) is called by in the worker's
    process; a subclass's override of it is what runs."""
    if isinstance(method, str) or not callable(method):
        raise TypeError(f"{method!r}: pass the worker's method (e.g. PolicyWorker.train), not its name")
    return method.__name__
