"""The config sits above generation and below every part: the config never imports a generation
backend, a generation backend never imports the config, and the shared errors import nothing of rlplane."""

from __future__ import annotations

import ast
from pathlib import Path

import rlplane
from rlplane.config import loading
from rlplane.errors import ConfigError

SRC = Path(rlplane.__file__).parent


def _imported(path: Path) -> set[str]:
    """Every module ``path`` imports, at its top or inside a function."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_config_never_imports_generation():
    for path in sorted((SRC / "config").glob("*.py")):
        assert not {m for m in _imported(path) if m.startswith("rlplane.generation")}, path.name


def test_generation_never_imports_config():
    for path in sorted((SRC / "generation").glob("*.py")):
        assert not {m for m in _imported(path) if m.startswith("rlplane.config")}, path.name


def test_errors_and_extras_are_the_ground_floor():
    for name in ("errors.py", "extras.py"):
        assert not {m for m in _imported(SRC / name) if m.startswith("rlplane")}, name


def test_the_loader_raises_the_shared_config_error():
    assert loading.ConfigError is ConfigError
