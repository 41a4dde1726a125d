"""RabbitBus: the bus contract over RabbitMQ with aio-pika.

Topology (names derive from one exchange name, so a test or a second deployment can live beside
another on one broker):
- ``<exchange>``: durable topic exchange every message is published to;
- ``<exchange>.dlx``: durable topic exchange for dead letters, and ``<exchange>.dead-letters``,
  the durable queue that keeps them (bound with ``#``);
- ``<exchange>.<queue>``: one queue per subscription name, whose ``x-dead-letter-exchange`` is
  the DLX, so even a message the broker itself rejects (or one we could not republish) lands
  there.

Reliability choices, each answering a measured pitfall of aio-pika 10 / RabbitMQ:
- publisher confirms on, and ``on_return_raises`` so a mandatory publish that no queue takes
  raises ``UnroutableError`` instead of being confirmed and dropped;
- a publish that fails because the connection dropped is retried (same message id) once the
  robust connection is back; consumers dedupe by id where it matters;
- deliveries are acknowledged after the handler returns; a failure is republished to the DLX
  with the reason in ``x-gavel-reason`` and then acknowledged (a plain reject would lose the
  reason); if that republish fails the message is rejected, and the queue's DLX still keeps it;
- each subscription has its own channel, so its prefetch (``basic.qos``) is its own and closing
  it hands unacknowledged deliveries back to the broker;
- a bounded queue of common/topology.py (the mechanism's submissions) is declared with
  ``x-max-length`` and ``x-overflow: reject-publish``: a publish it refuses is nacked, raised as
  QueueFullError (``publish_many`` goes on with the rest and names the refused ones at the end).
  A queue that exists with other arguments (one made before the bound) makes RabbitMQ refuse the
  declaration (406 PRECONDITION_FAILED): that is a SubscriptionError that names the queue, what
  differs and what to do, rather than a consumer quietly running without the bound.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import aio_pika
import aiormq
import structlog
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractIncomingMessage, AbstractQueue

from common.bus import DeadLetter, Delivery, Handler
from common.clock import Clock, WallClock
from common.codec import DEFAULT_CODEC, Codec, id_sequence
from common.config import BusSettings, redact_url
from common.errors import (
    BrokerUnreachableError,
    BusClosedError,
    BusError,
    DecodeError,
    NameClaimedError,
    PublishError,
    QueueFullError,
    SubscriptionError,
    UnroutableError,
)
from common.messages.base import Message
from common.topics import check_subscription
from common.topology import bound_arguments, queue_bounds
from common.transport.acks import AckBatcher
from common.transport.consumer import ConsumerLoop

log = structlog.get_logger("gavel.bus.rabbit")

REASON_HEADER = "x-gavel-reason"
QUEUE_HEADER = "x-gavel-queue"
PERSISTENT = int(aio_pika.DeliveryMode.PERSISTENT)
CONTENT_TYPE = "application/x-msgpack"

# Errors that mean "the connection or channel went away": retry after reconnecting.
_CONNECTION_LOST = (
    aiormq.exceptions.AMQPConnectionError,
    aiormq.exceptions.ChannelInvalidStateError,
    aiormq.exceptions.ConnectionClosed,
    ConnectionError,
    asyncio.IncompleteReadError,
)


def _header_text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def connect_error(url: str, e: BaseException, *, timeout_s: float) -> BusError:
    """A failed connection as one line that says what is wrong and what to check.

    A broker that answered and refused (credentials, vhost, TLS) will refuse again: a BusError.
    One that did not answer (closed port, timeout, reset, DNS) may still be starting: a
    BrokerUnreachableError, which `gavel serve` waits out. What aiormq 7 raises, measured against
    the local RabbitMQ: bad credentials, ProbableAuthenticationError (ACCESS_REFUSED); a vhost
    that does not exist or that the user may not use, InvalidFrameError "Expected one of
    ['Connection.OpenOk'], got <Connection.Close ...>" (the broker's 530 NOT_ALLOWED, its text
    lost); a closed port, a reset or DNS, AMQPConnectionError; no answer, TimeoutError.
    """
    where = redact_url(url)
    parsed = urllib.parse.urlparse(url)
    user = _user(url)
    vhost = urllib.parse.unquote(parsed.path[1:]) or "/"
    refused = f"RabbitMQ at {where} refused the connection"
    if isinstance(e, aiormq.exceptions.ProbableAuthenticationError):
        hint = ""
        if user == "guest" and parsed.hostname not in ("localhost", "127.0.0.1", "::1"):
            hint = "; RabbitMQ lets guest log in only from localhost"
        return BusError(
            f"{refused}: user {user!r} could not log in: wrong user name or password (ACCESS_REFUSED{hint}; "
            "rabbitmqctl list_users / authenticate_user)"
        )
    if isinstance(e, aiormq.exceptions.InvalidFrameError) and "Connection.OpenOk" in str(e):
        return BusError(
            f"{refused}: vhost {vhost!r} does not exist or user {user!r} may not use it "
            "(rabbitmqctl list_vhosts / list_permissions)"
        )
    if isinstance(e, aiormq.exceptions.ConnectionClosed) and len(e.args) == 2 and e.args[0] in (403, 530):
        return BusError(f"{refused}: {e.args[1]} (rabbitmqctl list_users / list_vhosts / list_permissions)")
    if isinstance(e, aiormq.exceptions.AuthenticationError):
        return BusError(f"{refused}: no authentication mechanism in common: {e}")
    tls = _ssl_cause(e)
    if tls is not None:
        return BusError(
            f"TLS with RabbitMQ at {where} failed: {tls.reason or tls} (is the port a TLS listener, and is the "
            "broker's certificate signed by the cafile in the URL, for this host name?)"
        )
    if isinstance(e, TimeoutError):
        return BrokerUnreachableError(
            f"cannot connect to RabbitMQ at {where}: no answer within {timeout_s:g} s (GAVEL_CONNECT_TIMEOUT_S)"
        )
    return BrokerUnreachableError(f"cannot connect to RabbitMQ at {where}: {type(e).__name__}: {e}")


def _user(url: str) -> str:
    """The user an AMQP URL logs in as (aio-pika's default: guest)."""
    return urllib.parse.unquote(urllib.parse.urlparse(url).username or "guest")


def _ssl_cause(e: BaseException | None) -> ssl.SSLError | None:
    for _ in range(10):  # the chain of causes, bounded
        if e is None or isinstance(e, ssl.SSLError):
            return e
        e = e.__cause__ or e.__context__
    return None


class RabbitSubscription:
    def __init__(
        self,
        bus: RabbitBus,
        name: str,
        channel: AbstractChannel,
        queue: AbstractQueue,
        handler: Handler,
        concurrency: int,
    ) -> None:
        self._bus = bus
        self._name = name
        self._channel = channel
        self._queue = queue
        self._handler = handler
        self._consumer_tag: str | None = None
        self._active = False
        self._loop: ConsumerLoop[AbstractIncomingMessage] = ConsumerLoop(
            self._deliver, concurrency=concurrency, name=f"rabbit-consumer-{name}"
        )
        self._acks = AckBatcher(
            lambda e: log.warning("ack_lost", queue=name, error=type(e).__name__), _CONNECTION_LOST
        )

    @property
    def queue(self) -> str:
        return self._name

    @property
    def active(self) -> bool:
        return self._active and not self._channel.is_closed and self._bus.connected

    async def _attach(self) -> None:
        self._loop.start()

        async def on_message(incoming: AbstractIncomingMessage) -> None:
            # aio-pika starts one task per delivery, in delivery order; handing them to our own
            # loop keeps that order and bounds how many handlers run at once.
            self._loop.push(incoming)

        self._consumer_tag = await self._queue.consume(on_message, no_ack=False)
        self._active = True

    async def _deliver(self, incoming: AbstractIncomingMessage) -> None:
        await self._bus._handle(self._name, incoming, self._handler, self._acks)

    async def cancel(self, timeout_s: float = 30.0) -> None:
        if not self._active:
            return
        self._active = False
        self._loop.halt()  # before any await: no new handler may start from here on
        self._bus._forget(self)
        if self._consumer_tag is not None and not self._channel.is_closed:
            with contextlib.suppress(*_CONNECTION_LOST, aiormq.exceptions.AMQPError, asyncio.TimeoutError):
                await self._queue.cancel(self._consumer_tag, timeout=timeout_s)
        # Running handlers finish and acknowledge; what was prefetched but not started goes back
        # to the broker when the channel closes (unacknowledged deliveries are requeued).
        await self._loop.stop(timeout_s)
        with contextlib.suppress(*_CONNECTION_LOST, aiormq.exceptions.AMQPError, asyncio.TimeoutError):
            await asyncio.wait_for(self._acks.flush(), timeout_s)  # what finished is acknowledged
            await self._channel.close()


class RabbitBus:
    """The bus over RabbitMQ. See the module docstring and common.bus for the contract."""

    def __init__(
        self,
        settings: BusSettings,
        *,
        codec: Codec = DEFAULT_CODEC,
        clock: Clock | None = None,
        source: str = "gavel",
        id_factory: Callable[[], str] | None = None,
        publish_window: int = 512,
    ) -> None:
        self._settings = settings
        self._codec = codec
        self._clock = clock or WallClock()
        self._source = source
        self._publish_window = publish_window
        self._new_id = id_factory or id_sequence()
        # Every publish carries the user it logs in as (RabbitMQ's validated user-id), so that a
        # receiver knows who sent it (a job's owner) and no one can say they are someone else.
        # Only a user the URL names: under another login (a TLS certificate) the broker would
        # refuse a user-id that is not the connection's.
        self.user = _user(settings.amqp_url) if urllib.parse.urlparse(settings.amqp_url).username else ""
        self.exchange_name = settings.exchange
        self.dlx_name = f"{settings.exchange}.dlx"
        self.dead_letter_queue = f"{settings.exchange}.dead-letters"
        self._connection: aio_pika.abc.AbstractRobustConnection | None = None
        self._channel: AbstractChannel | None = None
        self._exchange: AbstractExchange | None = None
        self._dlx: AbstractExchange | None = None
        self._subscriptions: list[RabbitSubscription] = []
        self._declared_queues: set[str] = set()
        self._bounds = queue_bounds(settings.submissions_max_length)  # queue (below the exchange) -> bound
        self.reconnects = 0  # times the robust connection came back after a drop
        self.dead_lettered: collections.Counter[str] = collections.Counter()  # queue -> messages dead-lettered
        self._claims: set[str] = set()  # names this connection holds (claim), taken again after a reconnect
        self._reclaiming: asyncio.Task[None] | None = None
        self._lost_at: float | None = None  # loop time the connection was lost, until it is back
        self._closing = False  # our own close: not a lost connection

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        c = self._connection
        return c is not None and not c.is_closed and c.connected.is_set()

    def queue_name(self, queue: str) -> str:
        """The broker-side name of a subscription queue."""
        return f"{self.exchange_name}.{queue}"

    def queue_arguments(self, queue: str) -> dict[str, object]:
        """What every declaration of ``queue`` carries: the DLX, and its bound if it has one."""
        return {"x-dead-letter-exchange": self.dlx_name, **bound_arguments(self._bounds.get(queue))}

    def _inequivalent(self, queue: str, e: aiormq.exceptions.ChannelPreconditionFailed) -> SubscriptionError:
        """RabbitMQ refuses to redeclare a queue with other arguments (and closes the channel):
        say which queue, what the broker said differs, and the two ways out."""
        name = self.queue_name(queue)
        said = str(e.args[1] if len(e.args) > 1 else e).removeprefix("PRECONDITION_FAILED - ")
        bound = self._bounds.get(queue)
        wanted = f"with at most {bound} messages waiting" if bound is not None else "without a bound"
        setting = f"GAVEL_SUBMISSIONS_MAX_LENGTH={bound if bound is not None else 'none'}"
        return SubscriptionError(
            f"queue {name!r} exists with other arguments than this gavel declares {wanted} ({setting}): {said}. "
            "Keep it as it is with GAVEL_SUBMISSIONS_MAX_LENGTH set to its own bound ('none': it has none); or, for "
            f"the bound, run so until it is empty (rabbitmqctl list_queues name messages), delete it (rabbitmqctl "
            f"delete_queue {name}) and start again"
        )

    async def start(self) -> None:
        url = self._settings.amqp_url
        self._closing = False
        try:
            self._connection = await aio_pika.connect_robust(
                url,
                timeout=self._settings.connect_timeout_s,
                reconnect_interval=self._settings.reconnect_interval_s,
                client_properties={"connection_name": self._source},
            )
        except (OSError, aiormq.exceptions.AMQPError, asyncio.TimeoutError) as e:
            raise connect_error(url, e, timeout_s=self._settings.connect_timeout_s) from None
        self._connection.reconnect_callbacks.add(self._on_reconnect)
        self._connection.close_callbacks.add(self._on_connection_lost)
        self._channel = await self._connection.channel(publisher_confirms=True, on_return_raises=True)
        self._exchange = await self._channel.declare_exchange(
            self.exchange_name, aio_pika.ExchangeType.TOPIC, durable=True
        )
        self._dlx = await self._channel.declare_exchange(self.dlx_name, aio_pika.ExchangeType.TOPIC, durable=True)
        dlq = await self._channel.declare_queue(self.dead_letter_queue, durable=True)
        await dlq.bind(self._dlx, "#")
        log.info("bus_connected", url=redact_url(url), exchange=self.exchange_name, source=self._source)

    def _on_connection_lost(self, _connection: object, reason: BaseException | None) -> None:
        """One warning line for a dropped connection (the broker closed it, restarted, the
        network went): aio-pika restores it on its own, and says so at debug only
        (common/log.py), where its error lines and a reader's traceback read like a crash."""
        if self._closing or self._lost_at is not None:
            return
        self._lost_at = asyncio.get_running_loop().time()
        log.warning(
            "bus_connection_lost", exchange=self.exchange_name, source=self._source,
            reason=(str(reason) or type(reason).__name__) if reason is not None else "not given",
            action=f"reconnecting every {self._settings.reconnect_interval_s:g} s",
        )

    def _on_reconnect(self, *_: object) -> None:
        self.reconnects += 1
        lost_at, self._lost_at = self._lost_at, None
        down_s = None if lost_at is None else round(asyncio.get_running_loop().time() - lost_at, 1)
        log.warning(
            "bus_reconnected", exchange=self.exchange_name, source=self._source, reconnects=self.reconnects, down_s=down_s
        )
        if self._claims:  # the claims went with the old connection
            self._reclaiming = asyncio.get_running_loop().create_task(self._reclaim())

    async def _reclaim(self) -> None:
        for name in sorted(self._claims):
            try:
                await self._declare_claim(name)
            except NameClaimedError as e:
                # Another process took the name while the broker was away. The mechanism tells the
                # two apart by their instances and fences this one (WorkerFenced.replaced_by).
                log.error("claim_lost", name=name, error=str(e), source=self._source)
            except Exception as e:  # noqa: BLE001 - a claim is retried at the next reconnect
                log.warning("claim_retry_failed", name=name, error=repr(e), source=self._source)

    async def close(self, timeout_s: float = 30.0) -> None:
        self._closing = True
        for sub in list(self._subscriptions):
            await sub.cancel(timeout_s)
        if self._connection is not None and not self._connection.is_closed:
            await self._connection.close()
        self._connection = None

    async def __aenter__(self) -> RabbitBus:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _require(self) -> tuple[AbstractChannel, AbstractExchange, AbstractExchange]:
        if self._connection is None or self._channel is None or self._exchange is None or self._dlx is None:
            raise BusClosedError("the RabbitMQ bus is not started (call start()) or is closed")
        return self._channel, self._exchange, self._dlx

    # -- publishing -----------------------------------------------------------------------------

    async def publish(
        self,
        message: Message,
        *,
        source: str | None = None,
        correlation_id: str | None = None,
        message_id: str | None = None,
        mandatory: bool = True,
    ) -> str:
        return await self._publish_message(
            message, source=source, correlation_id=correlation_id, message_id=message_id, mandatory=mandatory, timed=True
        )

    async def _publish_message(
        self,
        message: Message,
        *,
        source: str | None,
        correlation_id: str | None = None,
        message_id: str | None = None,
        mandatory: bool = True,
        timed: bool,
    ) -> str:
        _, exchange, _ = self._require()
        message_id = message_id or self._new_id()
        body = self._codec.encode(
            message,
            source=source or self._source,
            sent_at_s=self._clock.now_s(),
            message_id=message_id,
            correlation_id=correlation_id,
        )
        properties = aiormq.spec.Basic.Properties(
            delivery_mode=PERSISTENT,
            content_type=CONTENT_TYPE,
            message_id=message_id,
            correlation_id=correlation_id,
            message_type=message.SCHEMA,
            app_id=source or self._source,
            user_id=self.user or None,
        )
        await self._publish(exchange, body, properties, message.routing_key(), mandatory, timed=timed)
        return message_id

    async def publish_many(
        self,
        messages: Iterable[Message],
        *,
        source: str | None = None,
        on_confirmed: Callable[[int], None] | None = None,
    ) -> list[str]:
        """Keep up to ``publish_window`` confirms outstanding: one-at-a-time confirms cap a
        single publisher near 4k/s on this class of machine; a window lifts that limit.

        One watchdog replaces a timer per message (a sixth of the publishing CPU): the batch
        fails if ``confirm_timeout_s`` passes with no confirm at all.

        A message a full bounded queue refuses does not stop the batch: the rest are published,
        and then QueueFullError names the refused ones (``on_confirmed`` counts every message the
        broker settled, refused or not)."""
        window = asyncio.Semaphore(self._publish_window)
        confirmed = 0
        refused: list[int] = []
        first: list[QueueFullError] = []  # the first refusal's words, for the batch's error

        async def one(i: int, m: Message) -> str:
            nonlocal confirmed
            message_id = self._new_id()
            async with window:
                try:
                    await self._publish_message(m, source=source, message_id=message_id, timed=False)
                except QueueFullError as e:
                    refused.append(i)
                    first[:] = first or [e]
            confirmed += 1
            if on_confirmed is not None:
                on_confirmed(confirmed)
            return message_id

        batch = asyncio.gather(*(one(i, m) for i, m in enumerate(messages)))
        seen = -1
        while True:
            try:
                done, _ = await asyncio.wait({batch}, timeout=self._settings.confirm_timeout_s)
            except asyncio.CancelledError:
                # the caller gave up (Ctrl-C): the publishes in flight stop with it, rather than go
                # on against a channel being closed (each retried, its error never retrieved)
                batch.cancel()
                await asyncio.gather(batch, return_exceptions=True)
                raise
            if done:
                ids = list(batch.result())
                if refused:
                    raise QueueFullError(
                        f"{len(refused)} of {len(ids)} refused: {first[0]}",
                        refused=tuple(sorted(refused)), message_ids=tuple(ids),
                    )
                return ids
            if confirmed == seen:
                batch.cancel()
                await asyncio.gather(batch, return_exceptions=True)
                raise PublishError(f"no publish confirmed within {self._settings.confirm_timeout_s} s ({confirmed} were)")
            seen = confirmed

    async def publish_raw(self, routing_key: str, body: bytes, *, mandatory: bool = True) -> None:
        _, exchange, _ = self._require()
        properties = aiormq.spec.Basic.Properties(delivery_mode=PERSISTENT)
        await self._publish(exchange, bytes(body), properties, routing_key, mandatory, timed=True)

    async def _publish(
        self,
        exchange: AbstractExchange,
        body: bytes,
        properties: aiormq.spec.Basic.Properties,
        routing_key: str,
        mandatory: bool,
        *,
        timed: bool,
    ) -> None:
        """``timed``: this publish has its own confirm timeout (else its caller watches).

        Straight to the channel's aiormq layer: aio-pika's Message and Exchange.publish add a
        fifth to the CPU of a publish and nothing we use (the robust channel still reconnects)."""
        attempts = self._settings.publish_retries + 1
        timeout_s = self._settings.confirm_timeout_s if timed else None
        for attempt in range(1, attempts + 1):
            try:
                channel = await exchange.channel.get_underlay_channel()
                await channel.basic_publish(
                    body, exchange=exchange.name, routing_key=routing_key, properties=properties,
                    mandatory=mandatory, timeout=timeout_s,
                )
                return
            except aiormq.exceptions.PublishError:
                # Basic.Return: with mandatory=True, no queue is bound for this key.
                raise UnroutableError(routing_key) from None
            except aiormq.exceptions.DeliveryError as e:
                if isinstance(e.frame, aiormq.spec.Basic.Nack):
                    # the one nack our topology makes: a bounded queue is full (reject-publish)
                    raise QueueFullError(
                        f"a queue that {routing_key!r} routes to is full (x-max-length): the broker refused it"
                    ) from None
                raise PublishError(f"broker refused the publish to {routing_key!r}: {e.frame}") from None
            except asyncio.TimeoutError:
                raise PublishError(
                    f"publish to {routing_key!r} not confirmed within {self._settings.confirm_timeout_s} s"
                ) from None
            except _CONNECTION_LOST as e:
                # aio-pika restores the channel in the background but never replays a failed
                # publish: wait for it and send again under the same message id.
                log.warning("publish_retry", routing_key=routing_key, attempt=attempt, error=type(e).__name__)
                if attempt == attempts:
                    raise PublishError(f"publish to {routing_key!r} failed after {attempts} attempts: {e}") from None
                await self._wait_reconnected()

    async def _wait_reconnected(self) -> None:
        connection = self._connection
        if connection is None:
            raise BusClosedError("the RabbitMQ bus is closed")
        try:
            await asyncio.wait_for(connection.connected.wait(), self._settings.connect_timeout_s * 3)
            if self._channel is not None:
                await asyncio.wait_for(self._channel.ready(), self._settings.connect_timeout_s)  # type: ignore[attr-defined]
        except asyncio.TimeoutError:
            raise PublishError("the connection to RabbitMQ did not come back in time") from None

    # -- consuming ------------------------------------------------------------------------------

    async def subscribe(
        self,
        queue: str,
        bindings: Sequence[str],
        handler: Handler,
        *,
        prefetch: int | None = None,
        concurrency: int = 1,
        durable: bool = True,
    ) -> RabbitSubscription:
        self._require()
        assert self._connection is not None
        check_subscription(queue, bindings)
        name = self.queue_name(queue)
        channel = await self._connection.channel(publisher_confirms=False)
        await channel.set_qos(prefetch_count=prefetch or self._settings.prefetch)
        try:
            amqp_queue = await channel.declare_queue(
                name,
                durable=durable,
                exclusive=not durable,
                auto_delete=not durable,
                arguments=self.queue_arguments(queue),
            )
        except aiormq.exceptions.ChannelPreconditionFailed as e:
            raise self._inequivalent(queue, e) from None
        except aiormq.exceptions.ChannelClosed as e:
            raise SubscriptionError(f"cannot declare queue {name!r}: {e}") from None
        exchange = await channel.get_exchange(self.exchange_name, ensure=False)
        for pattern in bindings:
            await amqp_queue.bind(exchange, pattern)
        if durable:
            self._declared_queues.add(name)
        sub = RabbitSubscription(self, queue, channel, amqp_queue, handler, concurrency)
        await sub._attach()
        self._subscriptions.append(sub)
        return sub

    async def declare(self, queue: str, bindings: Sequence[str]) -> None:
        """Passively first: a queue that exists (made by its consumer or by the broker's
        definitions) needs no permission from us, so a least-privilege producer can check it;
        only a missing queue is created and bound (which needs configure and read rights)."""
        channel, exchange, _ = self._require()
        assert self._connection is not None
        check_subscription(queue, bindings)
        name = self.queue_name(queue)
        if await self._consumers_of(name) is not None:
            return
        try:
            amqp_queue = await channel.declare_queue(name, durable=True, arguments=self.queue_arguments(queue))
            for pattern in bindings:
                await amqp_queue.bind(exchange, pattern)
        except aiormq.exceptions.ChannelPreconditionFailed as e:  # made meanwhile, by another gavel
            raise self._inequivalent(queue, e) from None
        except aiormq.exceptions.ChannelAccessRefused:
            # A least-privilege producer (the CLI's broker user) may check the queue but not make
            # it; the channel it used is gone with the refusal, so this bus cannot go on either.
            user = _user(self._settings.amqp_url)
            raise SubscriptionError(f"queue {name!r} does not exist and user {user!r} may not create it") from None
        self._declared_queues.add(name)

    async def consumer_count(self, queue: str) -> int | None:
        self._require()
        return await self._consumers_of(self.queue_name(queue))

    async def queue_depth(self, queue: str) -> int | None:
        self._require()
        counts = await self._declared_counts(self.queue_name(queue))
        return None if counts is None else counts[0]

    async def dead_letter_depth(self) -> int | None:
        self._require()
        counts = await self._declared_counts(self.dead_letter_queue)
        return None if counts is None else counts[0]

    async def claim(self, name: str) -> None:
        self._require()
        await self._declare_claim(name)
        self._claims.add(name)

    async def _declare_claim(self, name: str) -> None:
        """An exclusive queue is the claim: RabbitMQ refuses it to every other connection
        (RESOURCE_LOCKED) and deletes it when this one closes, so a process that died holds
        nothing. On a channel of its own, since the refusal closes the channel; not robust, since
        the reconnect callback takes it again (and says so if it cannot)."""
        assert self._connection is not None
        channel = await self._connection.channel(publisher_confirms=False)
        try:
            await channel.declare_queue(self.queue_name(f"claim.{name}"), exclusive=True, auto_delete=True, robust=False)
            await channel.close()  # the queue belongs to the connection, not to the channel
        except aiormq.exceptions.ChannelLockedResource:
            raise NameClaimedError(f"{name!r} is held by another live connection to this broker") from None
        except aiormq.exceptions.ChannelAccessRefused:
            user = _user(self._settings.amqp_url)
            raise SubscriptionError(
                f"user {user!r} may not declare the claim queue {self.queue_name(f'claim.{name}')!r}"
            ) from None

    async def _consumers_of(self, name: str) -> int | None:
        counts = await self._declared_counts(name)
        return None if counts is None else counts[1]

    async def _declared_counts(self, name: str) -> tuple[int, int] | None:
        """A passive declaration (it needs no permission): the queue's (messages ready,
        consumers), None if it does not exist. On a channel of its own, since a 404 makes the
        broker close the channel."""
        assert self._connection is not None
        probe = await self._connection.channel(publisher_confirms=False)
        try:
            declared = await probe.declare_queue(name, passive=True)
            result = declared.declaration_result
            return int(result.message_count), int(result.consumer_count)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return None
        finally:
            if not probe.is_closed:
                await probe.close()

    def _forget(self, sub: RabbitSubscription) -> None:
        if sub in self._subscriptions:
            self._subscriptions.remove(sub)

    async def _handle(self, queue: str, incoming: AbstractIncomingMessage, handler: Handler, acks: AckBatcher) -> None:
        routing_key = incoming.routing_key or ""
        try:
            decoded = self._codec.decode(incoming.body)
        except DecodeError as e:
            await self._dead_letter(queue, incoming, f"undecodable: {e.reason}", acks)
            return
        delivery = Delivery(
            decoded.message, decoded.envelope, routing_key, queue, bool(incoming.redelivered), incoming.body,
            incoming.user_id or "",
        )
        try:
            await handler(delivery)
        except asyncio.CancelledError:
            raise  # not acknowledged: the broker redelivers it when the channel closes
        except Exception as e:  # a handler's failure must not stop the queue: dead-letter it
            await self._dead_letter(queue, incoming, f"handler failed: {type(e).__name__}: {e}", acks)
            return
        acks.ack(incoming)

    async def _dead_letter(self, queue: str, incoming: AbstractIncomingMessage, reason: str, acks: AckBatcher) -> None:
        reason = reason[:1000]
        routing_key = incoming.routing_key or ""
        log.warning("message_dead_lettered", queue=queue, routing_key=routing_key, reason=reason)
        self.dead_lettered[queue] += 1
        _, _, dlx = self._require()
        letter = aio_pika.Message(
            incoming.body,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            content_type=incoming.content_type,
            message_id=incoming.message_id,
            correlation_id=incoming.correlation_id,
            type=incoming.type,
            app_id=incoming.app_id,
            headers={REASON_HEADER: reason, QUEUE_HEADER: queue},
        )
        try:
            await dlx.publish(letter, routing_key or "unrouted", mandatory=False, timeout=self._settings.confirm_timeout_s)
        except (aiormq.exceptions.AMQPError, asyncio.TimeoutError, *_CONNECTION_LOST) as e:
            # Reject instead: the queue's own x-dead-letter-exchange keeps the message (with
            # RabbitMQ's x-death header, though without our reason).
            log.error("dead_letter_publish_failed", queue=queue, reason=reason, error=repr(e))
            await self._settle(incoming.reject(requeue=False), queue, routing_key)
            acks.rejected(incoming)
            return
        acks.ack(incoming)

    async def _settle(self, op: Any, queue: str, routing_key: str) -> None:
        try:
            await op
        except _CONNECTION_LOST as e:
            # The channel died under us: the broker requeues the delivery, and it will come back
            # (marked redelivered); handlers must be idempotent for that reason.
            log.warning("ack_lost", queue=queue, routing_key=routing_key, error=type(e).__name__)

    # -- inspection and cleanup -----------------------------------------------------------------

    async def take_dead_letters(self, limit: int = 1000) -> list[DeadLetter]:
        channel, _, _ = self._require()
        dlq = await channel.get_queue(self.dead_letter_queue, ensure=False)
        out: list[DeadLetter] = []
        while len(out) < limit:
            incoming = await dlq.get(no_ack=False, fail=False, timeout=self._settings.confirm_timeout_s)
            if incoming is None:
                break
            headers = incoming.headers or {}
            reason = _header_text(headers.get(REASON_HEADER))
            queue = _header_text(headers.get(QUEUE_HEADER))
            if not reason:  # rejected by the broker path: take RabbitMQ's own record
                deaths = headers.get("x-death") or []
                first = deaths[0] if deaths and isinstance(deaths[0], dict) else {}
                reason = f"rejected by broker: {_header_text(first.get('reason')) or 'unknown'}"
                queue = queue or _header_text(first.get("queue"))
            out.append(DeadLetter(queue, incoming.routing_key or "", bytes(incoming.body), reason))
            await incoming.ack()
        return out

    @property
    def declared_queues(self) -> frozenset[str]:
        """The queues this connection declared (their full names, below the exchange)."""
        return frozenset(self._declared_queues)

    async def delete_topology(self, queues: Iterable[str] = ()) -> None:
        """Delete this bus's exchanges and durable queues, and ``queues`` (full names: what other
        connections declared below the exchange). Tests and benchmarks clean up with it."""
        channel, _, _ = self._require()
        for name in sorted(self._declared_queues | {self.dead_letter_queue} | set(queues)):
            with contextlib.suppress(aiormq.exceptions.AMQPError):
                await channel.queue_delete(name)
        for name in (self.exchange_name, self.dlx_name):
            with contextlib.suppress(aiormq.exceptions.AMQPError):
                await channel.exchange_delete(name)
