"""Is a server there at all? One TCP connect with a deadline, before a client that would retry for minutes.

Ray's ``ray.init(address=...)`` retries a closed or unroutable GCS address without end, and MLflow's
HTTP client retries with backoff for minutes; a connect that is refused or times out here is a one-line
:class:`ConfigError` naming the key instead. A server that accepts the connection is left to the client.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from rlplane.errors import ConfigError

CONNECT_TIMEOUT_S = 10.0


def host_port(address: str, default_port: int) -> tuple[str, int]:
    """``host:port``, ``scheme://host:port/path`` or ``[v6]:port`` -> (host, port); ``ValueError`` if malformed."""
    parts = urlsplit(address if "://" in address else f"//{address}")
    if not parts.hostname:
        raise ValueError("no host")
    return parts.hostname, parts.port or default_port


def check_reachable(address: str, default_port: int, key: str, hint: str,
                    timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """A ``ConfigError`` naming ``key`` unless a TCP connection to ``address`` opens within ``timeout_s``."""
    try:
        host, port = host_port(address, default_port)
    except ValueError as e:  # a port that is not a number, or no host
        raise ConfigError([f"{key} = {address!r}: not a host:port address ({e}); {hint}"]) from None
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except socket.timeout:
        why = f"no answer within {timeout_s:g} s"
        raise ConfigError([f"{key} = {address!r}: cannot connect to {host}:{port} ({why}); {hint}"]) from None
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise ConfigError([f"{key} = {address!r}: cannot connect to {host}:{port} ({why}); {hint}"]) from None
