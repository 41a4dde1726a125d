"""Shared fixtures: the bus harness every contract test runs against every transport."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from common.config import BusSettings
from services.bus.memory import InMemoryBroker, InMemoryBus
from services.bus.probe import amqp_problem
from tests.support.broker import amqp_url, broker_required, delete_topology


@pytest.fixture(scope="session")
def broker_url() -> str:
    """The AMQP URL of a reachable broker. Fails (never skips) under `make test` and CI."""
    url = amqp_url()
    problem = amqp_problem(url)
    if problem:
        if broker_required():
            pytest.fail(f"{problem}; `make broker` starts a local one (GAVEL_REQUIRE_BROKER=1 is set)")
        pytest.skip(f"{problem} (set GAVEL_REQUIRE_BROKER=1 to make this a failure)")
    return url


class BusHarness:
    """Opens bus connections for one test and cleans up after it.

    kinds: ``memory`` (objects handed over), ``memory-serialized`` (every message through the
    codec) and ``rabbit``. For RabbitMQ every connection is a new client on a per-test exchange,
    so one test can stand in for several processes. For the in-memory bus every connection is
    a new InMemoryBus on one shared in-process broker.
    """

    def __init__(self, kind: str, url: str | None = None) -> None:
        self.kind = kind
        self._url = url
        self.exchange = f"gavel-test-{uuid.uuid4().hex[:10]}"
        self._buses: list[Any] = []
        self._broker = InMemoryBroker(serialize=kind == "memory-serialized")

    @property
    def is_rabbit(self) -> bool:
        return self.kind == "rabbit"

    def settings(self, **overrides: Any) -> BusSettings:
        base: dict[str, Any] = {
            "kind": "amqp",
            "amqp_url": self._url or "",
            "exchange": self.exchange,
            "confirm_timeout_s": 10.0,
        }
        base.update(overrides)
        return BusSettings(**base)

    async def connect(self, source: str = "test", **overrides: Any) -> Any:
        if not self.is_rabbit:
            memory = InMemoryBus(self._broker, source=source)
            await memory.start()
            self._buses.append(memory)
            return memory
        from services.bus.rabbit import RabbitBus

        bus = RabbitBus(self.settings(**overrides), source=source)
        await bus.start()
        self._buses.append(bus)
        return bus

    async def close(self) -> None:
        for bus in reversed(self._buses):
            await bus.close(timeout_s=5.0)
        if self.is_rabbit and self._buses:
            queues = {q for bus in self._buses for q in bus._declared_queues}
            prefix = f"{self.exchange}."
            await delete_topology(self._url or "", self.exchange, tuple(q.removeprefix(prefix) for q in queues))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that talks to RabbitMQ carries the `broker` mark (`-m "not broker"` skips them)."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "broker_url" in names or "rabbit" in names:
            item.add_marker(pytest.mark.broker)


@pytest.fixture(params=["memory", "memory-serialized", pytest.param("rabbit", marks=pytest.mark.broker)])
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[BusHarness]:
    url = request.getfixturevalue("broker_url") if request.param == "rabbit" else None
    h = BusHarness(request.param, url)
    try:
        yield h
    finally:
        await h.close()


@pytest.fixture
async def rabbit(broker_url: str) -> AsyncIterator[BusHarness]:
    h = BusHarness("rabbit", broker_url)
    try:
        yield h
    finally:
        await h.close()
