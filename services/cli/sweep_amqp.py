"""``gavel sweep --bus amqp``: the sweep's cells on RabbitMQ, for ``gavel serve simulator``
processes on any number of machines (sim/sweep_service.py).

The engine sim/sweep_driver.py's loop drives: cells are published persistent, confirmed and
mandatory to the durable queue ``<exchange>.sweep.cells`` (declared first, so they wait for
simulators that start later); results and starts come back on the sweep's own durable queue
``<exchange>.sweep.results.<sweep id>`` (the id is derived from the arguments: a restarted sweep
reads the same queue, and what simulators finished meanwhile is waiting there). A result is
acknowledged only once the loop has handled it (its ledger line written), so a sweep killed at any
moment loses no result. The results queue is deleted when the sweep is complete; an interrupted
sweep leaves it for its restart.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from common.bus import Bus, Delivery
from common.config import BusSettings
from common.messages import SweepCellFinished, SweepCellRequested, SweepCellStarted
from sim.sweep_driver import Event
from sim.sweep_service import (
    CELLS_BINDINGS,
    CELLS_QUEUE,
    results_bindings,
    results_queue,
)

log = structlog.get_logger("gavel.sweep")

RESULTS_PREFETCH = 64


class AmqpEngine:
    """Cells out to the simulators, their results and starts back."""

    def __init__(self, bus: Bus, sweep_id: str) -> None:
        self._bus = bus
        self._sweep_id = sweep_id
        self._events: asyncio.Queue[tuple[Event, asyncio.Future[None]]] = asyncio.Queue()
        self._handled: asyncio.Future[None] | None = None  # the event the loop has in hand

    async def open(self) -> int | None:
        """Declare the cells queue, consume the results; how many simulators consume the cells
        now (None: the broker does not say)."""
        await self._bus.declare(CELLS_QUEUE, list(CELLS_BINDINGS))
        await self._bus.subscribe(
            results_queue(self._sweep_id), list(results_bindings(self._sweep_id)), self._on_event, prefetch=RESULTS_PREFETCH
        )
        return await self._bus.consumer_count(CELLS_QUEUE)

    async def _on_event(self, delivery: Delivery) -> None:
        message = delivery.message
        if not isinstance(message, SweepCellFinished | SweepCellStarted):
            raise TypeError(f"{type(message).__name__} arrived on {delivery.routing_key}")
        handled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._events.put_nowait((message, handled))
        await handled  # acknowledged once the loop is past it (its ledger line written)

    async def submit(self, cells: list[SweepCellRequested]) -> None:
        await self._bus.publish_many(cells)

    async def next_event(self) -> Event:
        self._settle()
        event, self._handled = await self._events.get()
        return event

    def _settle(self) -> None:
        if self._handled is not None and not self._handled.done():
            self._handled.set_result(None)
        self._handled = None

    async def simulators(self) -> int | None:
        return await self._bus.consumer_count(CELLS_QUEUE)

    def close(self, *, complete: bool) -> None:
        """``complete``: the loop handled its last event, which is acknowledged; otherwise (an
        error, Ctrl-C) the event in hand is not, and the broker keeps it for the restart."""
        if complete:
            self._settle()
        elif self._handled is not None and not self._handled.done():
            self._handled.cancel()


async def delete_results_queue(settings: BusSettings, sweep_id: str) -> None:
    """The sweep is complete: its results queue goes (a late duplicate result is then unroutable,
    and the simulator that sent it drops it). Over a connection of its own, since the bus has no
    call to delete one queue; a failure leaves an empty queue behind, said in the log."""
    import aio_pika

    name = f"{settings.exchange}.{results_queue(sweep_id)}"
    try:
        connection = await aio_pika.connect(settings.amqp_url, timeout=settings.connect_timeout_s)
    except Exception as e:  # noqa: BLE001 - the results are written; only the tidying failed
        log.warning("results_queue_left", queue=name, error=f"{type(e).__name__}: {e}")
        return
    async with connection:
        channel = await connection.channel()
        with contextlib.suppress(Exception):
            await channel.queue_delete(name)
