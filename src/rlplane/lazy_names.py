"""A package's public names imported from their modules on first use (PEP 562), so that importing the package
costs nothing until a name is read: validating a config must not wait for torch."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy_names(package: str, homes: dict[str, tuple[str, ...]], renamed: dict[str, tuple[str, str]] | None = None
               ) -> tuple[list[str], Callable[[str], object], Callable[[], list[str]]]:
    """``(__all__, __getattr__, __dir__)`` for ``package``: ``homes`` maps a submodule to the names it defines,
    ``renamed`` a public name to ``(submodule, name there)``. A name is imported once and then kept in the
    package's namespace."""
    renamed = renamed or {}
    module_of = {name: module for module, names in homes.items() for name in names}
    public = sorted([*module_of, *renamed])

    def getattr_(name: str) -> object:
        module, attr = renamed.get(name) or (module_of.get(name), name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), attr)
        setattr(sys.modules[package], name, value)  # looked up once
        return value

    def dir_() -> list[str]:
        return sorted({*vars(sys.modules[package]), *public})

    return public, getattr_, dir_
