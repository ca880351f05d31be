"""Does a server answer at all? One handshake with a deadline, before a client that would wait or retry for minutes.

Ray's ``ray.init(address=...)`` retries an address with no GCS behind it without end, MLflow's HTTP client
retries with backoff for minutes, and wandb waits on its server; a server that accepts the connection and then
says nothing holds each of them with nothing printed. Here the connection is opened and the protocol's first
exchange made (gRPC's HTTP/2 preface for Ray, an HTTP request or TLS handshake for a tracker), all within
``timeout_s``; a refusal, a silence or a malformed address is one :class:`ConfigError` line naming the address,
the key that holds it and the key of the deadline.
"""

from __future__ import annotations

import socket
import ssl
import time
from urllib.parse import urlsplit

from rlplane.errors import ConfigError

# HTTP/2 with prior knowledge, as a gRPC client opens: the preface and an empty SETTINGS frame. A gRPC server
# answers with its own SETTINGS frame at once.
_H2_OPENING = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def host_port(address: str, default_port: int) -> tuple[str, int]:
    """``host:port``, ``scheme://host:port/path`` or ``[v6]:port`` -> (host, port); ``ValueError`` if malformed."""
    parts = urlsplit(address if "://" in address else f"//{address}")
    if not parts.hostname:
        raise ValueError("no host")
    return parts.hostname, parts.port or default_port


def check_server(address: str, default_port: int, key: str, hint: str, *, protocol: str, timeout_s: float,
                 timeout_key: str) -> None:
    """A ``ConfigError`` naming ``key`` unless the server at ``address`` answers ``protocol`` ("grpc", "http" or
    "https") within ``timeout_s`` (connect and first answer together)."""
    try:
        host, port = host_port(address, default_port)
    except ValueError as e:  # a port that is not a number, or no host
        raise ConfigError([f"{key} = {address!r}: not a host:port address ({e}); {hint}"]) from None
    deadline = time.monotonic() + timeout_s

    def fail(why: str) -> ConfigError:
        return ConfigError([f"{key} = {address!r}: {why}; {hint}"])

    try:
        conn = socket.create_connection((host, port), timeout=timeout_s)
    except socket.timeout:
        raise fail(f"cannot connect to {host}:{port} (no answer within {timeout_s:g} s, {timeout_key} = "
                   f"{timeout_s:g})") from None
    except OSError as e:
        raise fail(f"cannot connect to {host}:{port} ({e.strerror or type(e).__name__})") from None
    try:
        conn.settimeout(max(deadline - time.monotonic(), 0.01))
        if protocol == "https":  # the TLS handshake is the server's answer; its certificate is the client's business
            context = ssl.create_default_context()
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            conn = context.wrap_socket(conn, server_hostname=host)
        else:
            conn.sendall(_H2_OPENING if protocol == "grpc" else
                         f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            conn.recv(1)  # any byte, or the server closing: it is there and talks
    except socket.timeout:
        raise fail(f"{host}:{port} accepted the connection but did not answer within {timeout_s:g} s ({timeout_key} "
                   f"= {timeout_s:g}; raise it for a slow link)") from None
    except (ssl.SSLError, OSError):
        return  # it answered, if not what a client likes: the client's own error says what
    finally:
        conn.close()
