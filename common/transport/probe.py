"""Is an AMQP 0-9-1 broker answering at a URL? Standard library only, so scripts can run it
before any dependency is installed: ``python3 common/transport/probe.py [URL]`` exits 0 when a broker
answers the protocol header, 1 (and says why) when not.

A TCP connect alone proves nothing: a proxy or another server may hold the port. The broker
answers the AMQP protocol header with a Connection.Start method frame (frame type 1, channel 0).
"""

from __future__ import annotations

import socket
import sys
import urllib.parse

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"
_PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"


def amqp_problem(url: str, timeout_s: float = 2.0) -> str | None:
    """None if a broker answers at ``url``, else a sentence saying what went wrong."""
    parsed = urllib.parse.urlparse(url)
    host = parsed.hostname or "127.0.0.1"
    port = parsed.port or (5671 if parsed.scheme == "amqps" else 5672)
    if parsed.scheme == "amqps":
        # TLS brokers: a TCP connect is the most this check can do without a handshake.
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return None
        except OSError as e:
            return f"cannot reach RabbitMQ at {host}:{port} ({e})"
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(_PROTOCOL_HEADER)
            first = sock.recv(3)
    except OSError as e:
        return f"cannot reach RabbitMQ at {host}:{port} ({e})"
    if first[:3] != b"\x01\x00\x00":
        return f"something answers at {host}:{port}, but not an AMQP 0-9-1 broker (it sent {first!r})"
    return None


if __name__ == "__main__":
    problem = amqp_problem(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_URL)
    if problem:
        print(problem)
    sys.exit(1 if problem else 0)
