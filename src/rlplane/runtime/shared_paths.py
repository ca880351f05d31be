"""Can every worker see the run's files? Checked at start-up, before any worker loads a model.

Under Ray the driver writes a probe with a fresh token in each directory and every worker reads it back
first thing (a path existing on a node is not enough); a worker that cannot stops the run in one line
naming its node. Workers get absolute paths only.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

from rlplane.errors import ConfigError

PROBE_NAME = ".rlplane-node-probe"
SHARED_STORAGE_FIX = ("put it on storage every node mounts at the same path (NFS, a shared volume) or run on one "
                      "node (no cluster.address)")


class NodePathError(ConfigError):
    """A worker cannot see a path the driver wrote; the message is one line naming the node."""

    def __init__(self, message: str):
        super().__init__([message])


@dataclass(frozen=True)
class SharedPaths:
    """``probes``: absolute directory → what it is called; ``token``: the probes' content."""

    probes: dict[str, str]
    token: str


def write_probes(dirs: dict[str, Path]) -> SharedPaths:
    """On the driver: a probe file with a fresh token in each of ``dirs`` (name -> existing directory)."""
    token = secrets.token_hex(8)
    probes = {}
    for what, d in dirs.items():
        d = Path(d).absolute()
        (d / PROBE_NAME).write_text(token)
        probes[str(d)] = what
    return SharedPaths(probes, token)


def remove_probes(shared: SharedPaths | None) -> None:
    """On the driver, when the run ends."""
    for d in (shared.probes if shared else {}):
        try:
            os.unlink(os.path.join(d, PROBE_NAME))
        except OSError:
            pass


def node_label() -> str:
    """This process's node as a person finds it: IP, hostname and (under Ray) the node id's head."""
    host = socket.gethostname()
    try:
        import ray

        if ray.is_initialized():
            node_id = ray.get_runtime_context().get_node_id()
            return f"{ray.util.get_node_ip_address()} ({host}, Ray node {node_id[:12]})"
    except ImportError:
        pass
    return host


def _dir_problem(d: str, token: str) -> str | None:
    probe = os.path.join(d, PROBE_NAME)
    if not os.path.isdir(d):
        return "no such directory on this node"
    try:
        with open(probe) as f:
            seen = f.read().strip()
    except FileNotFoundError:
        return f"the driver's probe file {PROBE_NAME} is not there: this node has its own directory at that path"
    except OSError as e:
        return f"cannot read the driver's probe file {PROBE_NAME}: {e.strerror or type(e).__name__}"
    if seen != token:
        return f"its probe file {PROBE_NAME} is another run's: this node has its own directory at that path"
    if not os.access(d, os.W_OK):
        return "not writable from this node"
    return None


def check_shared_paths(shared: SharedPaths | None, role: str, model_name: str | None = None) -> None:
    """In a worker: :class:`NodePathError` if a probed directory or the absolute ``model_name`` is not usable from
    this node. ``shared`` None (``runtime: local``): nothing to check."""
    if shared is None:
        return
    for d, what in shared.probes.items():
        problem = _dir_problem(d, shared.token)
        if problem:
            raise NodePathError(f"{role} on node {node_label()} cannot see the {what} {d} ({problem}); "
                                f"{SHARED_STORAGE_FIX}")
    if model_name and os.path.isabs(model_name) and not os.path.isfile(os.path.join(model_name, "config.json")):
        raise NodePathError(
            f"{role} on node {node_label()} cannot see the model directory {model_name} (no config.json there); "
            "copy it to that path on every node or put it on storage every node mounts (NFS, a shared volume)"
        )


def node_path_error_in(err: BaseException) -> NodePathError | None:
    """The :class:`NodePathError` that killed a Ray actor in its constructor, from Ray's error text, if any."""
    text, marker = str(err), "NodePathError: "
    if marker not in text:
        return None
    return NodePathError(text[text.rindex(marker) + len(marker):].strip().splitlines()[0])


def driver_resolved(model_name: str) -> str:
    """``policy.model_name`` for workers: a local directory made absolute; other names unchanged."""
    path = os.path.expanduser(model_name)
    return os.path.abspath(path) if os.path.isdir(path) else model_name


def with_driver_model_path(cfg):
    """``cfg`` with ``policy.model_name`` as :func:`driver_resolved` gives it (the config workers get)."""
    resolved = driver_resolved(cfg.policy.model_name)
    if resolved == cfg.policy.model_name:
        return cfg
    return cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"model_name": resolved})})
