"""A config's registry source (``data.train`` / ``data.validation`` with ``data.dataset: registry``) checked and
read: its name against NeMo RL's registry (``rlplane.data.registry``), its options against the entry's, then its
rows through a ``load`` function handed in. Plain Python: the config checks a source while it is validated.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from rlplane.data.errors import DatasetError
from rlplane.data.registry import ENTRIES, GYM, MULTIMODAL, Entry, HubCopy, Source


def entry(name: str, key: str) -> Entry:
    """The entry ``name``, or a one-line error naming ``key`` (multimodal and NeMo-Gym names say why)."""
    if name in MULTIMODAL:
        raise DatasetError(f"{key} = {name!r}: a multimodal dataset of NeMo RL's (images, video or audio); rlplane "
                           "trains text-only language models: pick a text dataset")
    if name in GYM:
        raise DatasetError(f"{key} = {name!r}: NeMo-Gym's rows run in NeMo-Gym's environments, which rlplane does "
                           "not have; use a registry dataset or a JSONL file (data.dataset=jsonl)")
    if name not in ENTRIES:
        close = difflib.get_close_matches(str(name), ENTRIES, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}? " if close else ""
        raise DatasetError(f"{key} = {name!r}: not a NeMo RL dataset name; {hint}known: {', '.join(ENTRIES)} (or a "
                           "hub id with data.dataset=hf data.train.path=ID)")
    return ENTRIES[name]


# Options that are not text, by name (every other option is text, or null where its default is): NeMo RL's types.
_FLAGS = ("extract_answer", "verifiable_only", "require_valid", "use_preserving_dataset")
_COUNTS = ("max_samples", "characters_per_sample")  # a positive number, or null for all


def _option_problem(name: str, value: Any, default: Any) -> str | None:
    """What is wrong with ``value`` for option ``name`` (None: nothing)."""
    if name in _FLAGS:
        return None if isinstance(value, bool) else "true or false"
    if name in _COUNTS:
        ok = value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)
        return None if ok else "a whole number of at least 1, or null"
    if name == "seed":
        return None if isinstance(value, int) and not isinstance(value, bool) else "a whole number"
    return None if isinstance(value, str) or (value is None and default is None) else "text"


def resolve_options(e: Entry, given: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``given`` over ``e``'s defaults; an option it does not take, a value of the wrong kind, or a split it does
    not have, is an error naming ``key``'s (a ``data.train`` / ``data.validation`` section's) option."""
    unknown = sorted(set(given) - set(e.defaults))
    if unknown:
        takes = ", ".join(e.defaults) or "none"
        raise DatasetError(f"{key}.options.{unknown[0]}: not an option of {e.name} (its options: {takes}); remove it")
    for name, value in given.items():
        if (want := _option_problem(name, value, e.defaults[name])) is not None:
            raise DatasetError(f"{key}.options.{name} = {value!r}: {e.name}'s {name} is {want}")
    opts = {**e.defaults, **given}
    if e.splits and opts.get("split") not in e.splits:
        raise DatasetError(f"{key}.split = {opts.get('split')!r}: {e.name} has the splits {', '.join(e.splits)}; "
                           "set one of them")
    return opts


def registry_source(section, key: str) -> Source:
    """The registry :class:`Source` of a ``data.train`` / ``data.validation`` section (``key``): its ``options``
    plus the generic ``split``, ``subset`` and ``seed`` where the dataset takes them (a split it does not take must
    be its own one); the name, options and local file checked, so a mistake is found with the config's."""
    e = entry(section.name, f"{key}.name")
    options = dict(section.options)
    for name, value in (("split", section.split), ("subset", section.subset), ("seed", section.seed)):
        if value is None or name in options:
            continue
        if name in e.defaults:
            options[name] = value
        elif name != "seed" and not e.needs_path:
            fixed = {getattr(c, name) for c in e.copies(e.defaults)}
            if fixed == {None}:
                raise DatasetError(f"{key}.{name} = {value!r}: {e.name} has no {name}s; remove it")
            if fixed != {value}:
                raise DatasetError(f"{key}.{name} = {value!r}: {e.name} reads {name} "
                                   f"{', '.join(sorted(map(str, fixed - {None})))} only; remove it")
    resolve_options(e, options, key)
    if e.needs_path and not section.path:
        raise DatasetError(f"{key}: {e.name} reads a local file; set {key}.path=FILE")
    return Source(section.name, options, section.path)


def registry_rows(source: Source, load: Callable[[HubCopy], Iterable[dict]], key: str) -> list[dict]:
    """NeMo RL's rows of ``source``: each hub copy read with ``load`` (a local copy: ``load`` reads
    ``source.path``), then formatted; ``problem``/``answer`` added from ``messages[0]``/``messages[1]``. ``key``:
    the config section errors name (``data.train``)."""
    e = entry(source.name, f"{key}.name")
    opts = resolve_options(e, source.options, key)
    if e.needs_path and not source.path:
        raise DatasetError(f"{key}: {e.name} reads a local file; set {key}.path=FILE")
    if e.needs_path:
        copies = [HubCopy(source.path, opts.get("subset"), opts.get("split", "train"))]
    else:  # a local copy stands where the hub id (or URL) was, read with the same subset and split
        copies = [replace(c, repo=source.path) if source.path else c for c in e.copies(opts)]
    hub_rows = [row for c in copies for row in load(c)]
    out = []
    for row in e.rows(hub_rows, opts):
        messages = row["messages"]
        if len(messages) >= 2:
            row = {**row, "problem": messages[0]["content"], "answer": messages[1]["content"]}
        out.append(row)
    return out
