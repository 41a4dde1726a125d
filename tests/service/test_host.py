"""The service host: health, graceful shutdown on SIGTERM, refusal of bad setups."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from structlog.testing import capture_logs

from common.bus import Bus, Delivery
from common.errors import ServiceError
from common.host import ServiceHost
from common.messages import JobRejected
from tests.support.messages import submitted
from tests.support.waiting import Collector


class Refuser:
    """A tiny real service: refuses every submission, one at a time, when told to go on."""

    def __init__(self, name: str = "refuser") -> None:
        self.name = name
        self.bus: Bus | None = None
        self.go_on = asyncio.Event()
        self.handling = asyncio.Event()
        self.stopped = False

    async def start(self, bus: Bus) -> None:
        self.bus = bus
        await bus.subscribe("refuser", ["job.submitted"], self.on_submitted)

    async def on_submitted(self, d: Delivery) -> None:
        self.handling.set()
        await self.go_on.wait()
        assert self.bus is not None
        await self.bus.publish(JobRejected(d.message.spec.job_id, "refused"))  # type: ignore[attr-defined]

    async def stop(self) -> None:
        self.stopped = True


class Broken:
    name = "broken"

    async def start(self, bus: Bus) -> None:
        raise RuntimeError("no config")

    async def stop(self) -> None:
        return None


async def test_health_reports_consumers_and_sigterm_drains_in_flight_work(harness):
    bus = await harness.connect("host")
    observer_bus = await harness.connect("observer")
    rejected = Collector()
    await observer_bus.subscribe("observer", ["job.rejected"], rejected)

    service = Refuser()
    host = ServiceHost(bus, [service], shutdown_timeout_s=10)
    with capture_logs() as events:
        running = asyncio.create_task(host.run_until_stopped())
        await _until(lambda: host.health().ready)
        health = host.health()
        assert health.as_dict()["services"] == (
            {"name": "refuser", "started": True, "consumers": 1, "consumers_active": 1},
        )

        await observer_bus.publish(submitted(1))
        await asyncio.wait_for(service.handling.wait(), 10)
        os.kill(os.getpid(), signal.SIGTERM)  # mid-handler
        await _until(lambda: not host.health().services[0].consumers_active)
        assert not running.done()  # still waiting for the in-flight handler
        service.go_on.set()
        await asyncio.wait_for(running, 20)

    # The in-flight message was finished (its consequence published) before the bus closed.
    await rejected.wait_for_count(1)
    assert rejected.messages == [JobRejected("1", "refused")]
    assert rejected.deliveries[0].envelope.source == "refuser"
    assert service.stopped and not bus.connected
    names = [e["event"] for e in events]
    assert names.index("signal_received") < names.index("host_stopping") < names.index("host_stopped")


async def test_a_service_that_fails_to_start_stops_the_others_and_names_itself():
    from common.transport.memory import InMemoryBus

    first = Refuser()
    host = ServiceHost(InMemoryBus(), [first, Broken()])
    with pytest.raises(ServiceError, match="service 'broken' failed to start: no config"):
        await host.start()
    assert first.stopped


async def test_events_logged_by_a_service_handler_carry_the_service_name():
    import structlog
    from structlog.testing import LogCapture

    from common.transport.memory import InMemoryBus

    class Talker(Refuser):
        async def on_submitted(self, d: Delivery) -> None:
            structlog.get_logger().info("job_seen", job_id=d.message.spec.job_id)  # type: ignore[attr-defined]

    capture = LogCapture()
    old = structlog.get_config()
    structlog.configure(processors=[structlog.contextvars.merge_contextvars, capture])
    try:
        bus = InMemoryBus()
        host = ServiceHost(bus, [Talker("talker")])
        await host.start()
        await bus.publish(submitted(5))
        await bus.drain()
        await host.stop()
    finally:
        structlog.configure(**old)
    seen = [e for e in capture.entries if e["event"] == "job_seen"]
    assert seen == [{"event": "job_seen", "job_id": "5", "service": "talker", "log_level": "info"}]


def test_two_services_with_one_name_are_refused():
    with pytest.raises(ServiceError, match="share a name: refuser"):
        ServiceHost(object(), [Refuser(), Refuser()])  # type: ignore[arg-type]


async def _until(predicate, timeout_s: float = 10.0) -> None:
    from tests.support.waiting import eventually

    await eventually(predicate, timeout_s)
