"""The working state of a NeMo RL file's translation (:mod:`rlplane.config.nemo`): a copy of its tree that NeMo
RL keys are popped from and rlplane keys written to, with the notes and refusals collected on the way."""

from __future__ import annotations

import copy
from typing import Any

from rlplane.config.nemo_yaml import get_key


class Translation:
    """Pops NeMo RL keys from a copy of the tree, writes rlplane keys, collects notes and refusals."""

    def __init__(self, tree: dict):
        self.tree = copy.deepcopy(tree)
        self.notes: list[str] = []
        self.errors: list[str] = []

    def has(self, key: str) -> bool:
        parents, _, last = key.rpartition(".")
        node = get_key(self.tree, parents) if parents else self.tree
        return isinstance(node, dict) and last in node

    def pop(self, key: str, default: Any = None) -> Any:
        parents, _, last = key.rpartition(".")
        node = get_key(self.tree, parents) if parents else self.tree
        if not isinstance(node, dict) or last not in node:
            return default
        value = node.pop(last)
        while parents and isinstance(get_key(self.tree, parents), dict) and not get_key(self.tree, parents):
            parents, _, child = parents.rpartition(".")  # an emptied section goes too
            (get_key(self.tree, parents) if parents else self.tree).pop(child)
        return value

    def put(self, key: str, value: Any) -> None:
        node = self.tree
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value

    def refuse(self, key: str, value: Any, rule: str) -> None:
        self.errors.append(f"{key} = {value!r}: {rule}")

    def note(self, line: str) -> None:
        self.notes.append(line)
