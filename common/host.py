"""The service host: start a set of services on one bus, report health, stop them gracefully.

A service is a plain object with a name, ``start(bus)`` and ``stop()``. ``start`` subscribes and
starts whatever background work it has; the host hands it a ``ServiceBus``, a view of the shared
bus that stamps the service's name as the message source and records its subscriptions, so the
host knows which consumers are attached (health) and can cancel them first at shutdown.

Shutdown order (SIGTERM, SIGINT, or ``request_stop()``):
1. cancel every subscription: no new deliveries; running handlers finish and are acknowledged;
   prefetched, unstarted deliveries go back to their queues for another replica;
2. ``stop()`` each service, in reverse start order (timers, background tasks);
3. close the bus connection.
A second signal shortens the wait for running handlers to zero.

Connecting: with ``broker_wait_s`` (``gavel serve``: GAVEL_BROKER_WAIT_S), a broker that does not
answer yet is tried again with exponential backoff (0.5 s doubling to 8 s) for that long, each
failure logged as ``broker_unreachable``; plain-process deployments have no restart policy to
do it for us. A broker that answers and refuses (credentials, vhost) is not tried again.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import dataclasses
import signal
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

import structlog

from common.bus import Bus, DeadLetter, Delivery, Handler, Subscription
from common.errors import BrokerUnreachableError, GavelError, MisroutedError, ServiceError
from common.messages.base import Message

if TYPE_CHECKING:  # prometheus_client is imported only where metrics are on (every `gavel` command imports this)
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import CounterMetricFamily

log = structlog.get_logger("gavel.host")
QUEUE_DEPTH_EVERY_S = 5.0  # how often a host with metrics reads its queues' depths from the broker

FIRST_RETRY_S = 0.5  # waits between attempts to reach the broker double from here ...
LAST_RETRY_S = 8.0  # ... to here


class Service(Protocol):
    name: str

    async def start(self, bus: Bus) -> None: ...

    async def stop(self) -> None: ...


def _own_key_only(handler: Handler) -> Handler:
    """``handler`` for deliveries under their message's own routing key; any other raises
    MisroutedError, which the bus dead-letters with that reason (services dispatch on a
    message's type, and must not act on one a hostile publisher sent under another key)."""

    async def checked(d: Delivery) -> None:
        own = d.message.routing_key()
        if own != d.routing_key:
            raise MisroutedError(type(d.message).__name__, own, d.routing_key)
        await handler(d)

    return checked


class ServiceBus:
    """One service's view of the shared bus: its name on what it publishes, its subscriptions."""

    def __init__(self, bus: Bus, service_name: str) -> None:
        self._bus = bus
        self.service_name = service_name
        self.subscriptions: list[Subscription] = []

    @property
    def connected(self) -> bool:
        return self._bus.connected

    @property
    def user(self) -> str:
        return self._bus.user

    async def start(self) -> None:  # the host owns the connection
        return None

    async def close(self) -> None:
        await self.cancel_subscriptions()

    async def publish(
        self,
        message: Message,
        *,
        source: str | None = None,
        correlation_id: str | None = None,
        message_id: str | None = None,
        mandatory: bool = True,
    ) -> str:
        return await self._bus.publish(
            message,
            source=source or self.service_name,
            correlation_id=correlation_id,
            message_id=message_id,
            mandatory=mandatory,
        )

    async def publish_many(
        self,
        messages: Iterable[Message],
        *,
        source: str | None = None,
        on_confirmed: Callable[[int], None] | None = None,
    ) -> list[str]:
        return await self._bus.publish_many(messages, source=source or self.service_name, on_confirmed=on_confirmed)

    async def publish_raw(self, routing_key: str, body: bytes, *, mandatory: bool = True) -> None:
        await self._bus.publish_raw(routing_key, body, mandatory=mandatory)

    async def subscribe(
        self,
        queue: str,
        bindings: Sequence[str],
        handler: Handler,
        *,
        prefetch: int | None = None,
        concurrency: int = 1,
        durable: bool = True,
    ) -> Subscription:
        sub = await self._bus.subscribe(
            queue, bindings, _own_key_only(handler), prefetch=prefetch, concurrency=concurrency, durable=durable
        )
        self.subscriptions.append(sub)
        return sub

    async def take_dead_letters(self, limit: int = 1000) -> list[DeadLetter]:
        return await self._bus.take_dead_letters(limit)

    async def declare(self, queue: str, bindings: Sequence[str]) -> None:
        await self._bus.declare(queue, bindings)

    async def consumer_count(self, queue: str) -> int | None:
        return await self._bus.consumer_count(queue)

    async def claim(self, name: str) -> None:
        await self._bus.claim(name)

    async def queue_depth(self, queue: str) -> int | None:
        return await self._bus.queue_depth(queue)

    async def dead_letter_depth(self) -> int | None:
        return await self._bus.dead_letter_depth()

    @property
    def dead_lettered(self) -> collections.Counter[str]:
        return self._bus.dead_lettered

    async def cancel_subscriptions(self, timeout_s: float = 30.0) -> None:
        await asyncio.gather(*(sub.cancel(timeout_s) for sub in self.subscriptions))


@dataclasses.dataclass(frozen=True, slots=True)
class ServiceHealth:
    name: str
    started: bool
    consumers: int  # subscriptions the service made
    consumers_active: int  # of those, attached and receiving


@dataclasses.dataclass(frozen=True, slots=True)
class Health:
    bus_connected: bool
    services: tuple[ServiceHealth, ...]

    @property
    def ready(self) -> bool:
        """Bus connected, every service started, every consumer attached."""
        return self.bus_connected and all(s.started and s.consumers_active == s.consumers for s in self.services)

    def as_dict(self) -> dict[str, object]:
        return {"ready": self.ready, **dataclasses.asdict(self)}


class ServiceHost:
    def __init__(
        self, bus: Bus, services: Sequence[Service], *, shutdown_timeout_s: float = 30.0, broker_wait_s: float = 0.0,
        registry: CollectorRegistry | None = None, queue_depth_every_s: float = QUEUE_DEPTH_EVERY_S,
    ) -> None:
        names = [s.name for s in services]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ServiceError(f"two services share a name: {', '.join(duplicates)}")
        self._bus = bus
        self._services = list(services)
        self._views: dict[str, ServiceBus] = {}
        self._started: list[Service] = []
        self._shutdown_timeout_s = shutdown_timeout_s
        self._broker_wait_s = broker_wait_s
        self._stop_requested = asyncio.Event()
        self._stopped = False
        # Metrics of the host's own (docs/metrics.md, "Every service"): what each service's queues
        # hold, read every few seconds; what each service dead-lettered, read at scrape time.
        self._queue_watch: asyncio.Task[None] | None = None
        self._queue_depth_every_s = queue_depth_every_s
        self._registry = registry
        if registry is not None:
            from common.metrics import FunctionCollector, Gauge  # noqa: PLC0415 - metrics on

            self._queue_messages = Gauge(
                "gavel_queue_messages", "messages ready in each of the service's own queues", ("queue",), registry=registry
            )
            self._dead_letter_messages = Gauge(
                "gavel_dead_letter_messages", "messages waiting in the dead-letter queue", registry=registry
            )
            registry.register(FunctionCollector(self._dead_lettered_families))

    async def start(self) -> None:
        """Connect, then start every service in order. A failure stops what had started; a stop
        requested while waiting for the broker starts nothing."""
        if not await self._connect():
            return
        for service in self._services:
            view = ServiceBus(self._bus, service.name)
            self._views[service.name] = view
            # Start each service in a context with its name bound: the consumer tasks it creates
            # inherit that context, so every event its handlers log says which service spoke.
            context = contextvars.copy_context()
            context.run(structlog.contextvars.bind_contextvars, service=service.name)
            try:
                await asyncio.get_running_loop().create_task(service.start(view), context=context)
            except Exception as e:
                # a refusal on purpose says itself (the command's own last line repeats it)
                log.error("service_start_failed", service=service.name, error=str(e) if isinstance(e, GavelError) else repr(e))
                await self.stop()
                raise ServiceError(f"service {service.name!r} failed to start: {e}") from e
            self._started.append(service)
            log.info("service_started", service=service.name, consumers=len(view.subscriptions))
        log.info("host_ready", services=[s.name for s in self._services], ready=self.health().ready)
        if self._registry is not None:
            self._queue_watch = asyncio.get_running_loop().create_task(self._watch_queues(), name="host-queue-depths")

    def _dead_lettered_families(self) -> Iterable[CounterMetricFamily]:
        from common.metrics import CounterMetricFamily  # noqa: PLC0415 - metrics on

        family = CounterMetricFamily(
            "gavel_messages_dead_lettered", "messages this service refused (poison, a handler that failed)",
            labels=("service",),
        )
        counts = self._bus.dead_lettered
        for name, view in self._views.items():
            family.add_metric((name,), float(sum(counts[q] for q in {sub.queue for sub in view.subscriptions})))
        yield family

    async def _watch_queues(self) -> None:
        """Each service's queues and the dead-letter queue, read from the broker every few
        seconds (a passive declare each on RabbitMQ); a read that fails is tried at the next."""
        while True:
            try:
                for view in list(self._views.values()):
                    for queue in sorted({sub.queue for sub in view.subscriptions}):
                        depth = await self._bus.queue_depth(queue)
                        if depth is not None:
                            self._queue_messages.labels(queue).set(depth)
                dead = await self._bus.dead_letter_depth()
                if dead is not None:
                    self._dead_letter_messages.set(dead)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a broker that went away a moment: the gauges keep their last values
                log.debug("queue_depths_unread", error=repr(e))
            await asyncio.sleep(self._queue_depth_every_s)

    async def _connect(self) -> bool:
        """Start the bus, trying again while no broker answers, for up to ``broker_wait_s``.
        False if a stop was requested meanwhile."""
        loop = asyncio.get_running_loop()
        began_s = loop.time()
        backoff_s = FIRST_RETRY_S
        attempt = 0
        while True:
            attempt += 1
            try:
                await self._bus.start()
                break
            except BrokerUnreachableError as e:
                waited_s = loop.time() - began_s
                left_s = self._broker_wait_s - waited_s
                if left_s <= 0 and attempt == 1:
                    raise  # one attempt: its error as it is
                if left_s <= 0:
                    raise BrokerUnreachableError(
                        f"{e} (gave up after {waited_s:.1f} s and {attempt} attempts; "
                        "--broker-wait-s or GAVEL_BROKER_WAIT_S waits longer)"
                    ) from None
                retry_in_s = min(backoff_s, left_s)
                log.warning("broker_unreachable", attempt=attempt, retry_in_s=round(retry_in_s, 3), error=str(e))
                if await self._stop_requested_within(retry_in_s):
                    log.info("broker_wait_stopped", attempts=attempt)
                    return False
                backoff_s = min(backoff_s * 2, LAST_RETRY_S)
        if attempt > 1:
            log.info("broker_reached", attempt=attempt, waited_s=round(loop.time() - began_s, 3))
        return True

    async def _stop_requested_within(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._stop_requested.wait(), timeout_s)
        except asyncio.TimeoutError:
            return False
        return True

    def health(self) -> Health:
        started = {s.name for s in self._started}
        return Health(
            bus_connected=self._bus.connected,
            services=tuple(
                ServiceHealth(
                    name=s.name,
                    started=s.name in started,
                    consumers=len(self._views[s.name].subscriptions) if s.name in self._views else 0,
                    consumers_active=sum(sub.active for sub in self._views[s.name].subscriptions)
                    if s.name in self._views
                    else 0,
                )
                for s in self._services
            ),
        )

    def request_stop(self) -> None:
        if self._stop_requested.is_set():
            # A second request: stop waiting for running handlers.
            self._shutdown_timeout_s = 0.0
            log.warning("host_stop_forced")
        self._stop_requested.set()

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        log.info("host_stopping", timeout_s=self._shutdown_timeout_s)
        if self._queue_watch is not None:
            self._queue_watch.cancel()
            await asyncio.gather(self._queue_watch, return_exceptions=True)
        # 1. no new deliveries anywhere; running handlers finish
        await asyncio.gather(
            *(view.cancel_subscriptions(self._shutdown_timeout_s) for view in self._views.values())
        )
        # 2. background work, newest first
        for service in reversed(self._started):
            try:
                await service.stop()
            except Exception as e:  # one service's failed stop must not keep the others running
                log.error("service_stop_failed", service=service.name, error=repr(e))
        self._started.clear()
        # 3. the connection
        await self._bus.close()
        log.info("host_stopped")

    async def run_until_stopped(self, signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT)) -> bool:
        """Start, serve until a signal, ``request_stop()`` or a service's crash (a service may
        expose a ``crashed`` asyncio.Event), then shut down gracefully. True if one crashed."""
        loop = asyncio.get_running_loop()
        installed = []
        crashed: list[str] = []
        for sig in signals:
            loop.add_signal_handler(sig, self._on_signal, sig)
            installed.append(sig)
        try:
            try:
                await self.start()
                waits = [asyncio.ensure_future(self._stop_requested.wait())]
                waits += [asyncio.ensure_future(s.crashed.wait()) for s in self._services if hasattr(s, "crashed")]
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for w in waits:
                    w.cancel()
                crashed = [s.name for s in self._services if getattr(s, "crashed", None) is not None and s.crashed.is_set()]
                if crashed:
                    log.error("service_crashed", services=crashed, action="stopping the host")
            finally:
                await self.stop()  # signals stay handled meanwhile: a second one forces it
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
        return bool(crashed)

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("signal_received", signal=sig.name)
        self.request_stop()
