"""BusHarness: bus connections for one test, on any transport, cleaned up afterwards."""

from __future__ import annotations

import uuid
from typing import Any

from common.config import BusSettings
from common.topology import queue_bounds
from common.transport.memory import InMemoryBroker, InMemoryBus
from tests.support.broker import delete_topology


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
        self._bounded: dict[int | None, InMemoryBroker] = {}  # bound -> its broker (connect's submissions_max_length)

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
        """A new connection. ``overrides`` are BusSettings fields; on the in-memory bus only
        ``submissions_max_length`` means something: a connection to a broker of its own that
        bounds the queues of common/topology.py so (as the embedded default makes it)."""
        if not self.is_rabbit:
            broker = self._broker
            if "submissions_max_length" in overrides:
                broker = self._bounded_broker(overrides["submissions_max_length"])
            memory = InMemoryBus(broker, source=source, user="guest")  # as the test broker's login
            await memory.start()
            self._buses.append(memory)
            return memory
        from common.transport.rabbit import RabbitBus

        bus = RabbitBus(self.settings(**overrides), source=source)
        await bus.start()
        self._buses.append(bus)
        return bus

    def _bounded_broker(self, bound: int | None) -> InMemoryBroker:
        if bound not in self._bounded:
            self._bounded[bound] = InMemoryBroker(serialize=self.kind == "memory-serialized", max_lengths=queue_bounds(bound))
        return self._bounded[bound]

    async def close(self) -> None:
        for bus in reversed(self._buses):
            await bus.close(timeout_s=5.0)
        if self.is_rabbit and self._buses:
            queues = {q for bus in self._buses for q in bus.declared_queues}
            prefix = f"{self.exchange}."
            await delete_topology(self._url or "", self.exchange, tuple(q.removeprefix(prefix) for q in queues))
