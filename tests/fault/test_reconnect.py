"""The broker drops a client's connection: publishes made meanwhile are retried after the robust
connection comes back (aio-pika never replays them on its own), and consumers resume."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from tests.support.messages import submitted
from tests.support.waiting import Collector, eventually

pytestmark = pytest.mark.broker


def close_connection_named(name: str) -> None:
    """Have the broker close the client connection that announced ``name`` (as ops would)."""
    listing = subprocess.run(
        ["rabbitmqctl", "list_connections", "pid", "client_properties", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    pids = [line.split("\t")[0] for line in listing.splitlines() if f'"{name}"' in line]
    assert pids, f"no connection named {name!r}"
    for pid in pids:
        rabbitmqctl("close_connection", pid, "test: dropped on purpose")


def rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", *args], check=True, timeout=60, capture_output=True)


@contextlib.contextmanager
def own_login(name: str) -> Iterator[tuple[str, str]]:
    """A broker user of this test's own, with ``/``'s permissions: its password can be changed
    to keep a client out without touching anyone else's login. Yields (user, password)."""
    password = uuid.uuid4().hex
    rabbitmqctl("add_user", name, password)
    try:
        rabbitmqctl("set_permissions", "-p", "/", name, ".*", ".*", ".*")
        yield name, password
    finally:
        rabbitmqctl("delete_user", name)


@pytest.mark.slow  # ~8 s: eight rabbitmqctl calls (~1 s each), two dropped connections
async def test_publishes_during_a_dropped_connection_are_retried_and_consumers_resume(rabbit):
    consumer_name, publisher_name = f"consumer-{uuid.uuid4().hex[:6]}", f"publisher-{uuid.uuid4().hex[:6]}"
    consumer = await rabbit.connect(consumer_name, reconnect_interval_s=0.5)
    got = Collector()
    await consumer.subscribe("work", ["job.submitted"], got)
    with own_login(f"gavel-test-{publisher_name}") as (user, password):
        publisher = await rabbit.connect(
            publisher_name, amqp_url=f"amqp://{user}:{password}@127.0.0.1:5672/", reconnect_interval_s=0.5
        )
        # The robust connection tries again at once after a drop, and would be back within
        # milliseconds: a changed password keeps it out until the publishes are made.
        await asyncio.to_thread(rabbitmqctl, "change_password", user, uuid.uuid4().hex)
        await asyncio.to_thread(close_connection_named, publisher_name)
        await eventually(lambda: not publisher.connected, timeout_s=10)
        sending = [asyncio.create_task(publisher.publish(submitted(i))) for i in range(50)]
        await asyncio.to_thread(rabbitmqctl, "list_users", "-q")  # a broker round trip while they wait
        assert not publisher.connected and not any(t.done() for t in sending), "published while it was down"
        await asyncio.to_thread(rabbitmqctl, "change_password", user, password)
        ids = await asyncio.gather(*sending)
        await got.wait_until(lambda: {d.envelope.message_id for d in got.deliveries} >= set(ids), timeout_s=30)
        assert publisher.reconnects == 1

        await asyncio.to_thread(close_connection_named, consumer_name)
        await eventually(lambda: consumer.reconnects == 1 and consumer.connected, timeout_s=30)
        more = [await publisher.publish(submitted(100 + i)) for i in range(20)]
        await got.wait_until(lambda: {d.envelope.message_id for d in got.deliveries} >= set(more), timeout_s=30)
        await publisher.close()
    # At-least-once: a retried publish may arrive twice, never not at all; ids let consumers dedupe.
    assert {d.message.spec.job_id for d in got.deliveries} == {str(i) for i in range(50)} | {str(100 + i) for i in range(20)}  # type: ignore[attr-defined]


async def test_an_ordinary_reconnect_is_one_warning_each_way_and_the_librarys_account_is_debug(rabbit, tmp_path):
    """Issue 23: every service logged aiormq's and aio-pika's errors (and the reader's traceback)
    when the broker closed its connection, which the robust connection then restored. Now: one
    bus_connection_lost and one bus_reconnected warning; the library's lines only at debug
    (common/log.py, OrdinaryReconnect). About 1 s (two rabbitmqctl calls)."""
    import io
    import json

    from common.config import LogSettings
    from common.log import configure_logging

    stream = io.StringIO()
    configure_logging(LogSettings(level="info", format="json"), stream=stream, force=True)
    name = f"reconnect-log-{uuid.uuid4().hex[:6]}"
    bus = await rabbit.connect(name, reconnect_interval_s=0.5)
    await asyncio.to_thread(close_connection_named, name)
    await eventually(lambda: bus.reconnects == 1 and bus.connected, timeout_s=30)

    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    loud = [(e["event"], e["level"]) for e in events if e["level"] in ("warning", "error", "critical")]
    assert loud == [("bus_connection_lost", "warning"), ("bus_reconnected", "warning")], loud
    lost = next(e for e in events if e["event"] == "bus_connection_lost")
    assert "CONNECTION_FORCED" in lost["reason"] and lost["source"] == name
    assert not any("exception" in e for e in events)  # no traceback above debug
