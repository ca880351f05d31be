"""Can every worker see the run's files? Checked at start-up, before any worker loads a model.

Under ``runtime: ray`` the workers may run on other nodes (``cluster.address``). They write
checkpoints into ``checkpointing.checkpoint_dir`` and load ``policy.model_name`` when it is a local
directory, so those must be the same directories on every node: storage every node mounts. A path
that exists on a node is not enough (``/tmp/run`` exists everywhere), so the driver writes a probe
file holding a fresh token in each directory (:func:`write_probes`), and each worker, first thing
in its constructor, reads the probes back (:func:`check_shared_paths`). A worker that cannot stops
the run with one line naming its node and the path.

The driver hands workers absolute paths only (:func:`driver_resolved`): a relative path would be
resolved against each worker's own working directory, different on another node.
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
    """What the driver wrote for the workers to find: ``probes`` maps each directory (absolute) to
    what it called it (``run directory``, ``checkpoint directory``); ``token`` is the probes' content."""

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
    """In a worker, before it loads anything: raise :class:`NodePathError` if a probed directory
    cannot be seen (or written) from this node, or if ``model_name`` is an absolute path (a local
    model directory, resolved on the driver) that is no model directory here. ``shared`` None (the
    workers run in the driver's process, ``runtime: local``): nothing to check."""
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
    """The :class:`NodePathError` that killed a Ray actor in its constructor, from the error Ray raises
    (its text ends with the worker's traceback), if any."""
    text, marker = str(err), "NodePathError: "
    if marker not in text:
        return None
    return NodePathError(text[text.rindex(marker) + len(marker):].strip().splitlines()[0])


def driver_resolved(model_name: str) -> str:
    """``policy.model_name`` as workers should get it: a local directory (as the driver sees it) made
    absolute; embedded, packaged and hub names unchanged."""
    path = os.path.expanduser(model_name)
    return os.path.abspath(path) if os.path.isdir(path) else model_name


def with_driver_model_path(cfg):
    """``cfg`` with ``policy.model_name`` as :func:`driver_resolved` gives it (the config workers get)."""
    resolved = driver_resolved(cfg.policy.model_name)
    if resolved == cfg.policy.model_name:
        return cfg
    return cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"model_name": resolved})})
