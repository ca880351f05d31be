"""A config's registry source (``data.train`` / ``data.validation`` naming a NeMo RL dataset) checked: its name
against NeMo RL's registry (``rlplane.data.registry``), its options and its generic split, subset and seed against
the entry's. Plain Python: the config checks a source while it is validated, before any import; the rows are read
by ``registry.registry_rows`` through ``data/hub.py``.
"""

from __future__ import annotations

from rlplane.data.errors import DatasetError
from rlplane.data.registry import Source, entry, resolve_options


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
