"""InMemoryBus: RabbitMQ's topic-exchange semantics inside one process, for the embedded default,
the simulator and tests.

It keeps the parts of AMQP that change what a service sees: topic routing, one queue per name
with competing consumers and round-robin dispatch bounded by prefetch, FIFO per queue,
acknowledgement after the handler, redelivery of what a cancelled consumer had not started,
dead letters with reasons, and refusal of unroutable mandatory publishes. It drops what only a
network needs: messages are frozen dataclasses, so by default they are handed over as objects
(no encode/decode). ``serialize=True`` sends every message through the codec, as RabbitMQ would,
to catch a message that could not cross a real wire.

``drain()`` waits until no delivery is in flight anywhere: the simulator's virtual clock advances
only then.

Bounded queues (``max_lengths``, by queue name; the embedded default takes the topology's bound
from its settings, as RabbitBus does): a queue holds at most that many messages waiting (not
counting those dispatched to a consumer and not yet settled, as RabbitMQ counts), and refuses a
publish past it with QueueFullError while every other queue of the route still takes its copy,
as RabbitMQ's ``reject-publish`` does.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Iterable, Mapping, Sequence

import structlog

from common.bus import DeadLetter, Delivery, Handler
from common.clock import Clock, WallClock
from common.codec import DEFAULT_CODEC, Codec, Envelope, id_sequence
from common.errors import BusClosedError, DecodeError, NameClaimedError, QueueFullError, SubscriptionError, UnroutableError
from common.messages.base import Message
from common.topics import check_subscription, topic_matches
from common.transport.consumer import ConsumerLoop

log = structlog.get_logger("gavel.bus.memory")


class _Item:
    """One message sitting in a queue or an inbox."""

    __slots__ = ("message", "envelope", "body", "routing_key", "redelivered", "user_id")

    def __init__(
        self,
        message: Message | None,
        envelope: Envelope | None,
        body: bytes | None,
        routing_key: str,
        redelivered: bool = False,
        user_id: str = "",
    ) -> None:
        self.message = message
        self.envelope = envelope
        self.body = body
        self.routing_key = routing_key
        self.user_id = user_id
        self.redelivered = redelivered


class _Queue:
    __slots__ = ("name", "durable", "max_length", "pending", "consumers", "next_consumer")

    def __init__(self, name: str, durable: bool, max_length: int | None = None) -> None:
        self.name = name
        self.durable = durable
        self.max_length = max_length  # messages waiting at most (None: unbounded)
        self.pending: collections.deque[_Item] = collections.deque()
        self.consumers: list[MemorySubscription] = []
        self.next_consumer = 0


class MemorySubscription:
    def __init__(
        self, broker: InMemoryBroker, owner: InMemoryBus, queue: _Queue, handler: Handler, prefetch: int, concurrency: int
    ) -> None:
        self._broker = broker
        self._owner = owner
        self._queue = queue
        self._handler = handler
        self.prefetch = prefetch
        self.unacked = 0  # dispatched to this consumer, not yet settled
        self._active = True
        self._loop: ConsumerLoop[_Item] = ConsumerLoop(
            self._deliver, concurrency=concurrency, name=f"memory-consumer-{queue.name}"
        )
        self._loop.start()

    @property
    def queue(self) -> str:
        return self._queue.name

    @property
    def active(self) -> bool:
        return self._active

    def push(self, item: _Item) -> None:
        self.unacked += 1
        self._loop.push(item)

    async def _deliver(self, item: _Item) -> None:
        try:
            await self._broker._handle(self._queue, item, self._handler)
        except asyncio.CancelledError:
            # Forced stop mid-handler: the delivery was never acknowledged, so it goes back.
            item.redelivered = True
            self._queue.pending.appendleft(item)
            raise
        finally:
            self.unacked -= 1
            self._broker._settled(self._queue)

    async def cancel(self, timeout_s: float = 30.0) -> None:
        if not self._active:
            return
        self._active = False
        self._loop.halt()
        self._broker._detach(self)
        self._owner._forget(self)
        left = await self._loop.stop(timeout_s)
        # Prefetched but never started: back to the head of the queue, marked redelivered as
        # AMQP does, so ordering holds for the next consumer.
        for item in reversed(left):
            item.redelivered = True
            self._queue.pending.appendleft(item)
        self.unacked -= len(left)
        self._broker._requeued(self._queue, len(left))


class InMemoryBroker:
    """The in-process broker: queues, bindings, dead letters, in-flight accounting.

    Services connect to it with ``InMemoryBus(broker)``, one connection each, as they would to
    RabbitMQ; closing one connection cancels only its own subscriptions.
    """

    def __init__(
        self, *, codec: Codec = DEFAULT_CODEC, serialize: bool = False, max_lengths: Mapping[str, int] | None = None
    ) -> None:
        self.codec = codec
        self.serialize = serialize
        self.max_lengths = dict(max_lengths or {})  # queue name -> bound (common/topology.queue_bounds)
        self._queues: dict[str, _Queue] = {}
        self._bindings: list[tuple[str, str]] = []  # (pattern, queue name)
        self._routes: dict[str, list[_Queue]] = {}  # routing key -> queues (cache)
        self._dead: collections.deque[DeadLetter] = collections.deque()
        self.dead_lettered: collections.Counter[str] = collections.Counter()  # queue -> messages dead-lettered
        self._claims: dict[str, object] = {}  # name -> the connection (InMemoryBus) holding it
        self._in_flight = 0  # deliveries dispatched to consumers and not yet settled
        self.activity = 0  # messages enqueued or settled so far: a virtual clock's quiescence check
        self._idle = asyncio.Event()
        self._idle.set()

    # -- routing --------------------------------------------------------------------------------

    def route(self, key: str) -> list[_Queue]:
        queues = self._routes.get(key)
        if queues is None:
            names = dict.fromkeys(name for pattern, name in self._bindings if topic_matches(pattern, key))
            queues = [self._queues[name] for name in names]
            self._routes[key] = queues
        return queues

    def full(self, queues: Sequence[_Queue]) -> list[_Queue]:
        """The bounded queues among ``queues`` with no room for one more message."""
        return [q for q in queues if q.max_length is not None and len(q.pending) >= q.max_length]

    def enqueue(self, q: _Queue, item: _Item) -> None:
        self.activity += 1
        q.pending.append(item)
        if q.consumers:
            self._dispatch(q)

    def _dispatch(self, q: _Queue) -> None:
        """Hand pending messages round-robin to consumers with prefetch credit, as RabbitMQ does."""
        consumers = q.consumers
        n = len(consumers)
        while q.pending and n:
            for _ in range(n):
                sub = consumers[q.next_consumer % n]
                q.next_consumer = (q.next_consumer + 1) % n
                if sub.unacked < sub.prefetch:
                    break
            else:
                return  # every consumer is at its prefetch limit
            sub.push(q.pending.popleft())
            self._in_flight += 1
            self._idle.clear()

    # -- consumers ------------------------------------------------------------------------------

    def declare(self, queue: str, bindings: Sequence[str]) -> None:
        check_subscription(queue, bindings)
        q = self._queues.get(queue)
        if q is None:
            q = self._queues[queue] = _Queue(queue, durable=True, max_length=self.max_lengths.get(queue))
        for pattern in bindings:
            if (pattern, queue) not in self._bindings:
                self._bindings.append((pattern, queue))
        self._routes.clear()

    def attach(
        self,
        owner: InMemoryBus,
        queue: str,
        bindings: Sequence[str],
        handler: Handler,
        prefetch: int,
        concurrency: int,
        durable: bool,
    ) -> MemorySubscription:
        check_subscription(queue, bindings)
        q = self._queues.get(queue)
        if q is None:
            q = self._queues[queue] = _Queue(queue, durable, self.max_lengths.get(queue) if durable else None)
        elif q.durable != durable:
            raise SubscriptionError(f"queue {queue!r} exists with durable={q.durable}")
        elif not durable and q.consumers:
            raise SubscriptionError(f"queue {queue!r} is private (durable=False) and already consumed")
        for pattern in bindings:
            if (pattern, queue) not in self._bindings:
                self._bindings.append((pattern, queue))
        self._routes.clear()
        sub = MemorySubscription(self, owner, q, handler, prefetch, concurrency)
        q.consumers.append(sub)
        self._dispatch(q)
        return sub

    async def _handle(self, q: _Queue, item: _Item, handler: Handler) -> None:
        message, envelope = item.message, item.envelope
        if message is None or envelope is None:
            try:
                decoded = self.codec.decode(item.body)
            except DecodeError as e:
                self._dead_letter(q, item, f"undecodable: {e.reason}")
                return
            message, envelope = decoded.message, decoded.envelope
        delivery = Delivery(message, envelope, item.routing_key, q.name, item.redelivered, item.body or b"", item.user_id)
        try:
            await handler(delivery)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a handler's failure must not stop the queue: dead-letter it
            self._dead_letter(q, item, f"handler failed: {type(e).__name__}: {e}")

    def _dead_letter(self, q: _Queue, item: _Item, reason: str) -> None:
        body = item.body
        if body is None and item.message is not None and item.envelope is not None:
            env = item.envelope
            body = self.codec.encode(
                item.message,
                source=env.source,
                sent_at_s=env.sent_at_s,
                message_id=env.message_id,
                correlation_id=env.correlation_id,
            )
        self._dead.append(DeadLetter(q.name, item.routing_key, body or b"", reason[:1000]))
        self.dead_lettered[q.name] += 1
        log.warning("message_dead_lettered", queue=q.name, routing_key=item.routing_key, reason=reason[:1000])

    def _settled(self, q: _Queue) -> None:
        self._requeued(q, 1)

    def _requeued(self, q: _Queue, count: int) -> None:
        self.activity += 1
        self._in_flight -= count
        if q.consumers:
            self._dispatch(q)
        if self._in_flight == 0:
            self._idle.set()

    def _detach(self, sub: MemorySubscription) -> None:
        q = self._queues.get(sub.queue)
        if q is None or sub not in q.consumers:
            return
        q.consumers.remove(sub)
        if not q.durable and not q.consumers:
            # A private queue goes away with its last consumer (AMQP auto-delete).
            del self._queues[q.name]
            self._bindings = [(p, n) for p, n in self._bindings if n != q.name]
            self._routes.clear()

    # -- inspection -----------------------------------------------------------------------------

    def take_dead_letters(self, limit: int) -> list[DeadLetter]:
        out = []
        while self._dead and len(out) < limit:
            out.append(self._dead.popleft())
        return out

    @property
    def idle(self) -> bool:
        """No delivery is in flight (queues without consumers may still hold messages)."""
        return self._in_flight == 0

    async def drain(self, timeout_s: float | None = 60.0) -> None:
        """Wait until no delivery is in flight, including ones that handlers publish meanwhile."""

        async def wait() -> None:
            while self._in_flight:
                await self._idle.wait()

        await asyncio.wait_for(wait(), timeout_s)

    def queue_depth(self, queue: str) -> int | None:
        """Messages waiting in ``queue`` (not yet dispatched to a consumer); None: no such queue."""
        q = self._queues.get(queue)
        return len(q.pending) if q is not None else None

    @property
    def dead_letter_depth(self) -> int:
        return len(self._dead)

    def claim(self, name: str, holder: object) -> None:
        """``name`` for ``holder`` (a connection), unless another connection holds it."""
        held_by = self._claims.setdefault(name, holder)
        if held_by is not holder:
            raise NameClaimedError(f"{name!r} is held by another live connection")

    def release_claims(self, holder: object) -> None:
        for name in [n for n, h in self._claims.items() if h is holder]:
            del self._claims[name]

    def consumer_count(self, queue: str) -> int | None:
        q = self._queues.get(queue)
        return None if q is None else len(q.consumers)


class InMemoryBus:
    """A connection to an in-process broker. See the module docstring and common.bus.

    ``InMemoryBus()`` makes a private broker; pass ``broker=`` to connect several services (or a
    test's several 'processes') to one.
    """

    def __init__(
        self,
        broker: InMemoryBroker | None = None,
        *,
        codec: Codec = DEFAULT_CODEC,
        clock: Clock | None = None,
        source: str = "gavel",
        prefetch: int = 32,
        serialize: bool = False,
        id_factory: Callable[[], str] | None = None,
        max_lengths: Mapping[str, int] | None = None,
        user: str = "",
    ) -> None:
        # max_lengths: the bounded queues of a private broker (a shared one has its own)
        # user: the broker user this connection logs in as, on every delivery it publishes (as
        # RabbitMQ's validated user-id; "": none, as in the simulator)
        self.user = user
        self.broker = broker or InMemoryBroker(codec=codec, serialize=serialize, max_lengths=max_lengths)
        self._codec = self.broker.codec
        self._clock = clock or WallClock()
        self._source = source
        self._default_prefetch = prefetch
        self._new_id = id_factory or id_sequence()
        self._subscriptions: list[MemorySubscription] = []
        self._open = False

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._open

    async def start(self) -> None:
        self._open = True

    async def close(self, timeout_s: float = 30.0) -> None:
        for sub in list(self._subscriptions):
            await sub.cancel(timeout_s)
        self.broker.release_claims(self)  # as a closed connection's exclusive queues go
        self._open = False

    async def __aenter__(self) -> InMemoryBus:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check_open(self) -> None:
        if not self._open:
            raise BusClosedError("the in-memory bus is not started (call start()) or is closed")

    def _forget(self, sub: MemorySubscription) -> None:
        if sub in self._subscriptions:
            self._subscriptions.remove(sub)

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
        self._check_open()
        self._codec.validate(message)  # as strict as a wire: NaN, wrong types, unknown classes
        key = message.routing_key()
        broker = self.broker
        queues = broker.route(key)
        message_id = message_id or self._new_id()
        if not queues:
            if mandatory:
                raise UnroutableError(key)
            return message_id
        full = broker.full(queues)
        if full:  # as reject-publish: the queues with room take it, the publisher hears of the rest
            queues = [q for q in queues if q not in full]
        envelope = Envelope(
            message_id, message.SCHEMA, message.VERSION, source or self._source, self._clock.now_s(), correlation_id
        )
        if broker.serialize:
            body = self._codec.encode(
                message,
                source=envelope.source,
                sent_at_s=envelope.sent_at_s,
                message_id=message_id,
                correlation_id=correlation_id,
            )
            for q in queues:
                broker.enqueue(q, _Item(None, None, body, key, user_id=self.user))
        else:
            for q in queues:
                broker.enqueue(q, _Item(message, envelope, None, key, user_id=self.user))
        if full:
            names = ", ".join(q.name for q in full)
            raise QueueFullError(f"a queue that {key!r} routes to is full ({names}): refused there")
        return message_id

    async def publish_many(
        self,
        messages: Iterable[Message],
        *,
        source: str | None = None,
        on_confirmed: Callable[[int], None] | None = None,
    ) -> list[str]:
        ids: list[str] = []
        refused: list[int] = []
        first: QueueFullError | None = None
        for i, m in enumerate(messages):
            message_id = self._new_id()
            try:
                await self.publish(m, source=source, message_id=message_id)
            except QueueFullError as e:  # the rest are published all the same, as RabbitBus does
                refused.append(i)
                first = first or e
            ids.append(message_id)
            if on_confirmed is not None:
                on_confirmed(len(ids))
        if first is not None:
            raise QueueFullError(f"{len(refused)} of {len(ids)} refused: {first}", refused=tuple(refused), message_ids=tuple(ids))
        return ids

    async def publish_raw(self, routing_key: str, body: bytes, *, mandatory: bool = True) -> None:
        self._check_open()
        queues = self.broker.route(routing_key)
        if not queues and mandatory:
            raise UnroutableError(routing_key)
        full = self.broker.full(queues)
        for q in queues:
            if q not in full:
                self.broker.enqueue(q, _Item(None, None, bytes(body), routing_key))
        if full:
            raise QueueFullError(f"a queue that {routing_key!r} routes to is full ({', '.join(q.name for q in full)})")

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
    ) -> MemorySubscription:
        self._check_open()
        sub = self.broker.attach(
            self, queue, bindings, handler, prefetch or self._default_prefetch, concurrency, durable
        )
        self._subscriptions.append(sub)
        return sub

    async def declare(self, queue: str, bindings: Sequence[str]) -> None:
        self._check_open()
        self.broker.declare(queue, bindings)

    async def take_dead_letters(self, limit: int = 1000) -> list[DeadLetter]:
        return self.broker.take_dead_letters(limit)

    async def consumer_count(self, queue: str) -> int | None:
        self._check_open()
        return self.broker.consumer_count(queue)

    async def claim(self, name: str) -> None:
        self._check_open()
        self.broker.claim(name, self)

    # -- conveniences that forward to the broker ------------------------------------------------

    @property
    def idle(self) -> bool:
        return self.broker.idle

    async def drain(self, timeout_s: float | None = 60.0) -> None:
        await self.broker.drain(timeout_s)

    async def queue_depth(self, queue: str) -> int | None:
        return self.broker.queue_depth(queue)

    async def dead_letter_depth(self) -> int | None:
        return self.broker.dead_letter_depth

    @property
    def dead_lettered(self) -> collections.Counter[str]:
        return self.broker.dead_lettered  # the broker dead-letters: per queue, whoever consumed it
