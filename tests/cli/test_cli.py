"""The `gavel` command as a user runs it: a real process, exit codes, one-line errors."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import threading

import pytest

from tests.support.broker import delete_topology
from tests.support.cli import gavel
from tests.support.processes import ROOT


def test_config_prints_json_with_the_password_redacted():
    out = gavel("config", env={"GAVEL_AMQP_URL": "amqp://svc:hunter2@broker:5672/gavel"})
    assert out.returncode == 0, out.stderr
    settings = json.loads(out.stdout)
    assert settings["bus"]["amqp_url"] == "amqp://svc:***@broker:5672/gavel"
    assert "hunter2" not in out.stdout + out.stderr


def test_a_bad_setting_is_one_line_and_exit_2():
    out = gavel("config", env={"GAVEL_PREFETCH": "-3"})
    assert out.returncode == 2
    assert out.stderr.strip() == "gavel: GAVEL_PREFETCH must be a positive integer, got '-3'"
    assert "Traceback" not in out.stderr


def test_unreachable_broker_is_one_line_and_exit_1():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = gavel("bus", "check", "--amqp", f"amqp://guest:guest@127.0.0.1:{port}/", env={"GAVEL_CONNECT_TIMEOUT_S": "3"})
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gavel: cannot connect to RabbitMQ at amqp://guest:***@127.0.0.1:{port}/")


@pytest.mark.broker
def test_bus_check_and_dead_letters_against_the_broker(broker_url):
    import uuid

    exchange = f"gavel-test-cli-{uuid.uuid4().hex[:8]}"
    env = {"GAVEL_AMQP_URL": broker_url, "GAVEL_EXCHANGE": exchange}
    try:
        out = gavel("bus", "check", "--json", env=env)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["connected"] is True
        out = gavel("bus", "dead-letters", "--json", env=env)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == []
    finally:
        asyncio.run(delete_topology(broker_url, exchange))


def test_ensure_broker_refuses_a_port_that_is_not_a_broker():
    """The test command's broker check speaks AMQP: an HTTP server on the port is not a broker."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]

    def answer_http() -> None:
        try:
            conn, _ = server.accept()
        except OSError:  # the test closed the server with nobody connected: nothing to answer
            return
        with conn:
            conn.recv(8)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    threading.Thread(target=answer_http, daemon=True).start()
    try:
        out = subprocess.run(
            [os.path.join(ROOT, "scripts", "ensure-broker")],
            capture_output=True,
            text=True,
            env={**os.environ, "GAVEL_AMQP_URL": f"amqp://guest:guest@10.0.0.1:{port}/"},
            timeout=30,
        )
    finally:
        server.close()
    assert out.returncode == 1
    assert "cannot reach RabbitMQ at 10.0.0.1" in out.stdout
