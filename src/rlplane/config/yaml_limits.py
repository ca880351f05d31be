"""Bounded reading of config YAML: a file too big, nested too deep, or whose anchors and aliases expand past
what a config holds (the "billion laughs") is one line naming the file and the limit, refused before the tree
is built, in time and memory that do not grow with what it would expand to.

PyYAML builds an alias as a reference to its anchor's object, so the tree it returns is small; what blows up
is every reader that walks it (a copy, a merge, a dump, validation). The limits are counted the way such a
walk sees the tree: every alias as a full copy of its anchor.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml
from yaml.events import CollectionEndEvent, CollectionStartEvent, NodeEvent

from rlplane.errors import ConfigError

MAX_CONFIG_BYTES = 1 << 20  # a config file; NeMo RL's largest recipe is under 10 KB
MAX_CONFIG_VALUES = 10_000  # values of one file (or override), every alias counted as a copy; NeMo RL's: < 600
MAX_CONFIG_DEPTH = 32  # nesting of mappings and lists (aliases expanded); NeMo RL's: 6
MAX_DEFAULTS_DEPTH = 16  # files in one `defaults:` chain, the config itself included
MAX_DEFAULTS_FILES = 64  # files one config reads through all its `defaults:` (a list may name several)
MAX_INTERPOLATION_STEPS = 100_000  # values copied and `${...}` evaluated resolving one config; NeMo RL's: ~1,000
MAX_INTERPOLATION_DEPTH = 32  # `${a}` naming `${b}` naming ...; NeMo RL's: 3
MAX_INTERPOLATED_CHARS = MAX_CONFIG_BYTES  # a string built by `${...}` substitution


class ConfigTooLarge(ConfigError):
    """A config past one of this module's limits: reported as it is, whichever reader met it first."""


def _limit(where: str, what: str, name: str, value: int, fix: str) -> ConfigTooLarge:
    return ConfigTooLarge([f"config {where}: {what}, over {name} = {value:,}; {fix}"])


def read_config_text(path: Path) -> str:
    """The text of a config file, its size checked before it is read."""
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise _limit(str(path), f"{size:,} bytes", "MAX_CONFIG_BYTES", MAX_CONFIG_BYTES,
                         "a config is a few KB of settings: is this the right file?")
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)  # a file that grew since stat (a pipe, /dev/zero) is cut here
    except OSError as e:
        raise ConfigError([f"config {path}: cannot read it ({e.strerror or type(e).__name__})"]) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise _limit(str(path), f"more than {MAX_CONFIG_BYTES:,} bytes", "MAX_CONFIG_BYTES", MAX_CONFIG_BYTES,
                     "a config is a few KB of settings: is this the right file?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError([f"config {path}: not UTF-8 text (byte {e.start}); save it as UTF-8"]) from None


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts values and nesting as the parser hands them over, refuses a key given twice in
    one mapping (YAML would keep the last silently), and keeps the document's anchors for the expansion check."""

    def __init__(self, text: str, where: str, unique_keys: bool):
        super().__init__(text)
        self.where, self.unique_keys = where, unique_keys
        self.values = self.depth = 0
        self.kept_anchors: dict[str, yaml.Node] = {}

    def get_event(self):
        event = super().get_event()
        if isinstance(event, NodeEvent):
            self.values += 1
            if self.values > MAX_CONFIG_VALUES:
                raise _limit(self._at(event), f"more than {MAX_CONFIG_VALUES:,} values", "MAX_CONFIG_VALUES",
                             MAX_CONFIG_VALUES, "a config holds settings, not data: put data in a dataset file")
        if isinstance(event, CollectionStartEvent):
            self.depth += 1
            if self.depth > MAX_CONFIG_DEPTH:
                raise _limit(self._at(event), f"nested more than {MAX_CONFIG_DEPTH} levels deep", "MAX_CONFIG_DEPTH",
                             MAX_CONFIG_DEPTH, "flatten it")
        elif isinstance(event, CollectionEndEvent):
            self.depth -= 1
        return event

    def compose_document(self):  # PyYAML's, keeping the anchors it would drop
        self.get_event()  # DocumentStartEvent
        node = self.compose_node(None, None)
        self.get_event()  # DocumentEndEvent
        self.kept_anchors, self.anchors = self.anchors, {}
        return node

    def construct_mapping(self, node, deep=False):
        if self.unique_keys:
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *BASE` brings keys the mapping may then set again
                key = self.construct_object(key_node, deep=deep)
                if not isinstance(key, Hashable):
                    continue  # SafeLoader reports an unhashable key itself
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice",
                                                            key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)

    def _at(self, event_or_node) -> str:
        return f"{self.where}:{event_or_node.start_mark.line + 1}"


def _check_expansion(loader: _BoundedLoader, root: yaml.Node) -> None:
    """Count ``root``'s values and depth with every alias expanded, in time linear in the distinct nodes."""
    sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (values, depth) with aliases expanded
    open_nodes: set[int] = set()
    anchor_of = {id(n): name for name, n in loader.kept_anchors.items()}

    def named(node: yaml.Node) -> str:
        name = anchor_of.get(id(node))
        return f"the anchor &{name}" if name else "a section"

    def walk(node: yaml.Node, depth: int) -> tuple[int, int]:
        if id(node) in open_nodes:
            raise ConfigError([f"config {loader._at(node)}: {named(node)} holds an alias of itself (a tree with no "
                               "end); write the values out"])
        if id(node) not in sizes:
            if depth > MAX_CONFIG_DEPTH:
                raise _limit(loader._at(node), f"nested more than {MAX_CONFIG_DEPTH} levels deep once its aliases "
                             "are expanded", "MAX_CONFIG_DEPTH", MAX_CONFIG_DEPTH, "flatten it")
            open_nodes.add(id(node))
            children = ([c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode)
                        else node.value if isinstance(node, yaml.SequenceNode) else [])
            values, below = 1, 0
            for child in children:
                v, d = walk(child, depth + 1)
                values, below = values + v, max(below, d)
                if values > MAX_CONFIG_VALUES:
                    raise _limit(loader._at(node), f"{named(node)} here expands to more than {MAX_CONFIG_VALUES:,} "
                                 "values (its aliases each count as a copy)", "MAX_CONFIG_VALUES", MAX_CONFIG_VALUES,
                                 "anchors and aliases are for sharing a section, not multiplying one")
            open_nodes.discard(id(node))
            sizes[id(node)] = (values, below + 1)
        values, height = sizes[id(node)]
        if depth + height - 1 > MAX_CONFIG_DEPTH:
            raise _limit(loader._at(node), f"nested more than {MAX_CONFIG_DEPTH} levels deep once its aliases are "
                         "expanded", "MAX_CONFIG_DEPTH", MAX_CONFIG_DEPTH, "flatten it")
        return values, height

    walk(root, 1)


def parse_config_yaml(text: str, where: str, *, unique_keys: bool = True) -> Any:
    """``text`` (one YAML document) as Python values, within this module's limits; syntax errors are one
    :class:`ConfigError` line naming ``where`` and the line."""
    loader = _BoundedLoader(text, where, unique_keys)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(loader, node)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"{where}:{mark.line + 1}" if mark else where
        raise ConfigError([f"config {at}: not valid YAML ({getattr(e, 'problem', e)}); fix the syntax"]) from None
    except ConfigError:
        raise
    except ValueError as e:  # an integer of more digits than Python converts (4,300)
        raise ConfigError([f"config {where}: a value cannot be read ({e}); fix it"]) from None
    finally:
        loader.dispose()


def check_tree_bounds(tree: Any, where: str) -> None:
    """A tree built in Python (the API's ``config=`` mapping, an override's dotted key) within the same limits:
    no cycle, not too deep, not too many values."""
    count = 0
    stack: list[tuple[Any, int, tuple[int, ...]]] = [(tree, 1, ())]
    while stack:
        node, depth, parents = stack.pop()
        count += 1
        if count > MAX_CONFIG_VALUES:
            raise _limit(where, f"more than {MAX_CONFIG_VALUES:,} values", "MAX_CONFIG_VALUES", MAX_CONFIG_VALUES,
                         "a config holds settings, not data")
        if not isinstance(node, (dict, list, tuple)):
            continue
        if id(node) in parents:
            raise ConfigError([f"config {where}: a section contains itself; pass a tree, not a structure with a "
                               "cycle"])
        if depth > MAX_CONFIG_DEPTH:
            raise _limit(where, f"nested more than {MAX_CONFIG_DEPTH} levels deep", "MAX_CONFIG_DEPTH",
                         MAX_CONFIG_DEPTH, "flatten it")
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1, (*parents, id(node))) for child in children)
