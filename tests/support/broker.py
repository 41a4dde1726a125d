"""Reaching the test broker: an AMQP URL that works, or a clear failure under `make test`/CI."""

from __future__ import annotations

import os
import socket
import urllib.parse

from common.config import DEFAULT_AMQP_URL


def amqp_url() -> str:
    return os.environ.get("GAVEL_AMQP_URL") or DEFAULT_AMQP_URL


def broker_required() -> bool:
    """`make test` and CI set GAVEL_REQUIRE_BROKER=1: an unreachable broker is then a failure."""
    return os.environ.get("GAVEL_REQUIRE_BROKER") == "1" or os.environ.get("CI", "") not in ("", "0", "false")


def broker_reachable(url: str, timeout_s: float = 2.0) -> str | None:
    """None if a TCP connection to the broker opens, else why not."""
    parsed = urllib.parse.urlparse(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or (5671 if parsed.scheme == "amqps" else 5672)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as e:
        return f"cannot reach RabbitMQ at {host}:{port} ({e})"
