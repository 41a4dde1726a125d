"""The virtual clock: time moves only when everything is quiet, in a deterministic order."""

from __future__ import annotations

import asyncio

import pytest

from common.bus import Delivery
from common.messages import JobRejected
from common.transport.memory import InMemoryBroker, InMemoryBus
from sim.clock import SimulationStalled, VirtualClock
from tests.support.messages import submitted


async def test_sleepers_wake_in_time_order_and_ties_in_sleep_order():
    clock = VirtualClock(InMemoryBroker())
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, s: float) -> None:
        await clock.sleep(s)
        woke.append((name, clock.now_s()))

    tasks = [asyncio.create_task(sleeper(n, s)) for n, s in (("c", 30.0), ("a", 10.0), ("b", 10.0), ("d", 3600.0))]
    await clock.run_until(lambda: len(woke) == 4)
    assert woke == [("a", 10.0), ("b", 10.0), ("c", 30.0), ("d", 3600.0)]
    await asyncio.gather(*tasks)


async def test_time_waits_for_every_delivery_and_its_cascade():
    broker = InMemoryBroker()
    bus = InMemoryBus(broker)
    clock = VirtualClock(broker)
    await bus.start()
    handled_at: list[float] = []

    async def refuse(d: Delivery) -> None:
        await asyncio.sleep(0)  # some real work between awaits
        await bus.publish(JobRejected(d.message.spec.job_id, "no"))  # type: ignore[attr-defined]

    async def observe(d: Delivery) -> None:
        handled_at.append(clock.now_s())

    await bus.subscribe("refuser", ["job.submitted"], refuse)
    await bus.subscribe("observer", ["job.rejected"], observe)

    async def submit_later() -> None:
        await clock.sleep(100.0)
        for i in range(20):
            await bus.publish(submitted(i))

    task = asyncio.create_task(submit_later())
    ticker_done = asyncio.create_task(clock.sleep(50.0))
    await clock.run_until(lambda: len(handled_at) == 20)
    # all 20 cascades were handled at t=100: time did not move on while they were in flight
    assert handled_at == [100.0] * 20
    await asyncio.gather(task, ticker_done)
    await bus.close()


async def test_a_run_that_can_never_finish_says_so():
    clock = VirtualClock(InMemoryBroker())
    with pytest.raises(SimulationStalled, match="nothing in flight and nobody asleep"):
        await clock.run_until(lambda: False)


async def test_max_time_stops_the_clock():
    clock = VirtualClock(InMemoryBroker())
    task = asyncio.create_task(clock.sleep(1e6))
    await clock.run_until(lambda: False, max_time_s=500.0)
    assert clock.now_s() == 500.0 and not task.done()
    task.cancel()


async def test_a_sleep_to_now_waits_for_everything_else_due_now():
    broker = InMemoryBroker()
    bus = InMemoryBus(broker)
    clock = VirtualClock(broker)
    await bus.start()
    seen: list[str] = []

    async def record(d: Delivery) -> None:
        seen.append(d.message.spec.job_id)  # type: ignore[attr-defined]

    await bus.subscribe("q", ["job.submitted"], record)
    order: list[str] = []

    async def first_reader() -> None:
        await clock.sleep(10.0)
        await clock.sleep(0.0)  # barrier: the other publisher at t=10 has been handled by now
        order.append(f"reader saw {len(seen)}")

    async def publisher() -> None:
        await clock.sleep(10.0)
        for i in range(3):
            await bus.publish(submitted(i))

    tasks = [asyncio.create_task(first_reader()), asyncio.create_task(publisher())]
    await clock.run_until(lambda: bool(order))
    assert order == ["reader saw 3"] and clock.now_s() == 10.0
    await asyncio.gather(*tasks)
    await bus.close()
