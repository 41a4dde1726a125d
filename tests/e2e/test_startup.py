"""Starting services against RabbitMQ as a new user does: before the broker is up, with a wrong
vhost or password, with no journal flags; and reading the mechanism's status as a person.
(Without a broker: tests/cli/test_cli_robustness.py.)"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import urllib.parse
from pathlib import Path

import pytest

from common.config import redact_url
from tests.e2e.test_operations import gavel
from tests.support.cli import gavel as gavel_bare
from tests.support.processes import logged, the_line
from tests.support.waiting import eventually

pytestmark = pytest.mark.broker


def with_url(url: str, *, port: int | None = None, password: str | None = None, vhost: str | None = None) -> str:
    parts = urllib.parse.urlparse(url)
    user = parts.username or "guest"
    netloc = f"{user}:{password if password is not None else parts.password or 'guest'}@{parts.hostname}:{port or parts.port or 5672}"
    path = f"/{vhost}" if vhost is not None else parts.path
    return parts._replace(netloc=netloc, path=path).geturl()


# -- E. a service started before the broker waits for it -------------------------------------------


async def test_a_service_started_before_the_broker_waits_for_it(cluster, tmp_path, broker_url):
    """The service's broker is a port that refuses connections (bound, not listening) until the
    service has said `broker_unreachable`; then it forwards to the real broker (about 3 s)."""
    broker = urllib.parse.urlparse(broker_url)
    port = socket.socket()
    port.bind(("127.0.0.1", 0))

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(broker.hostname, broker.port or 5672)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except ConnectionError:
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    url = with_url(broker_url, port=port.getsockname()[1])
    log = tmp_path / "estimator.log"
    cluster.start("estimator", "serve", "estimator", "--amqp", url, "--broker-wait-s", "30")
    try:
        await eventually(lambda: logged(log, "broker_unreachable"), timeout_s=30, poll_s=0.05)
        assert not logged(log, "host_ready")
        server = await asyncio.start_server(forward, sock=port)  # the broker is "up" from now on
        try:
            await eventually(lambda: logged(log, "host_ready"), timeout_s=30, poll_s=0.05)
            reached = logged(log, "broker_reached")
            assert len(reached) == 1 and int(reached[0]["attempt"]) >= 2, log.read_text()
            first = logged(log, "broker_unreachable")[0]
            assert (first["attempt"], first["retry_in_s"], first["level"]) == (1, 0.5, "warning")
            assert "Connect call failed" in str(first["error"])
            # stopped while the forwarder still runs, so the service says goodbye to the broker
            await asyncio.to_thread(cluster.stop_all)
        finally:
            server.close()
    finally:
        port.close()


# -- F. a broker that refuses: one line that says what to check ------------------------------------


def test_a_wrong_vhost_or_password_is_one_line_saying_what_to_check(broker_url):
    user = urllib.parse.urlparse(broker_url).username or "guest"
    no_vhost = with_url(broker_url, vhost="no-such-vhost")
    bad_password = with_url(broker_url, password="not-the-password")
    vhost_line = (
        f"gavel: RabbitMQ at {redact_url(no_vhost)} refused the connection: vhost 'no-such-vhost' does not exist "
        f"or user {user!r} may not use it (rabbitmqctl list_vhosts / list_permissions)"
    )
    password_line = (
        f"gavel: RabbitMQ at {redact_url(bad_password)} refused the connection: user {user!r} could not log in: "
        "wrong user name or password (ACCESS_REFUSED; rabbitmqctl list_users / authenticate_user)"
    )
    submit = ("submit", "--job-type", "ResNet-18 (batch size 64)", "--steps", "10")
    for argv, url, line in (
        (("bus", "check"), no_vhost, vhost_line),
        (submit, no_vhost, vhost_line),
        (("bus", "check"), bad_password, password_line),
        (submit, bad_password, password_line),
    ):
        out = gavel_bare(*argv, "--amqp", url)
        assert (out.returncode, out.stderr.strip()) == (1, line), argv


def test_a_service_does_not_wait_for_a_broker_that_refused_it(broker_url, tmp_path):
    """Waiting cannot fix a password: `serve` fails at once, though it would wait for a broker
    that does not answer (GAVEL_BROKER_WAIT_S=60; the process timeout is the bound)."""
    env = {"GAVEL_LOG_FORMAT": "json", "GAVEL_BROKER_WAIT_S": "60", "XDG_STATE_HOME": str(tmp_path)}
    out = gavel_bare("serve", "estimator", "--amqp", with_url(broker_url, password="not-the-password"), env=env, timeout_s=20)
    assert out.returncode == 1
    assert "refused the connection: user" in the_line(out.stderr)
    assert "broker_unreachable" not in out.stderr


# -- H. the mechanism keeps a journal by default -----------------------------------------------------


async def ready(health: Path, pid: int) -> None:
    def is_ready() -> bool:
        try:
            body = json.loads(health.read_text())
        except (OSError, json.JSONDecodeError):
            return False
        return body.get("pid") == pid and body.get("ready") is True

    await eventually(is_ready, timeout_s=30, poll_s=0.1)


@pytest.mark.slow  # ~8 s: a mechanism process restarted
async def test_a_mechanism_started_without_journal_flags_keeps_its_jobs_across_a_restart(cluster, tmp_path):
    """Two mechanism starts and a SIGKILL between them (about 6 s)."""
    health = tmp_path / "mechanism.health"
    mechanism = cluster.start("mechanism", "serve", "mechanism", "--health-file", str(health))
    await ready(health, mechanism.pid)
    # XDG_STATE_HOME is the test's directory; the file is named for the cluster (exchange, broker, vhost)
    url = urllib.parse.urlsplit(cluster.url)
    journal = tmp_path / "gavel" / f"mechanism-{cluster.exchange}@{url.hostname}_{url.port or 5672}.sqlite"
    opened = logged(tmp_path / "mechanism.log", "journal_opened")
    assert [(e["path"], e["source"]) for e in opened] == [(str(journal), "default")]
    out = gavel(cluster, "submit", "--job-type", "ResNet-18 (batch size 64)", "--steps", "1000", "--job-id", "kept")
    assert out.returncode == 0, out.stderr

    def known() -> bool:
        answer = gavel(cluster, "jobs", "--json")
        return answer.returncode == 0 and any(row["id"] == "kept" for row in json.loads(answer.stdout))

    await eventually(known, timeout_s=30, poll_s=0.2)
    cluster.kill("mechanism")
    mechanism = cluster.start("mechanism", "serve", "mechanism", "--health-file", str(health))
    await ready(health, mechanism.pid)
    assert known()  # at once: it came back from the journal, not from a queue


# -- G. status for people, and JSON as it was --------------------------------------------------------


@pytest.mark.slow  # ~9 s: services as processes
async def test_cluster_and_job_print_for_people_and_json_on_request(cluster, tmp_path):
    health = tmp_path / "mechanism.health"
    mechanism = cluster.start("mechanism", "serve", "mechanism", "--no-journal", "--health-file", str(health))
    await ready(health, mechanism.pid)
    out = gavel(cluster, "submit", "--job-type", "ResNet-18 (batch size 64)", "--steps", "1000", "--job-id", "g1")
    assert out.returncode == 0, out.stderr

    async def answered(*argv: str) -> subprocess.CompletedProcess[str]:
        await eventually(lambda: gavel(cluster, *argv).returncode == 0, timeout_s=30, poll_s=0.2)
        return gavel(cluster, *argv)

    text, as_json = await answered("cluster"), await answered("cluster", "--json")
    report = json.loads(as_json.stdout)
    assert report["policy"] == "max_min_fairness_perf"
    assert not text.stdout.lstrip().startswith("{")
    assert re.search(r"^policy: +max_min_fairness_perf$", text.stdout, re.M), text.stdout
    assert re.search(r"^jobs_active: +\d+$", text.stdout, re.M), text.stdout

    text, as_json = await answered("job", "g1"), await answered("job", "g1", "--json")
    job = json.loads(as_json.stdout)
    assert job["id"] == "g1", job
    for key in ("id", "state"):  # whatever state a job with no worker is in, as the JSON says
        assert re.search(rf"^{key}: +{re.escape(str(job[key]))}$", text.stdout, re.M), text.stdout
    assert not text.stdout.lstrip().startswith("{")
