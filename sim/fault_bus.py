"""A fault-injecting wrapper of the simulator's bus: what a broker and a network may do to messages,
seeded, in virtual time (issue 13; docs/reliability.md, "The fault model").

- duplication (``dup``), any message: RabbitMQ delivers at least once (a redelivery after a lost
  ack, a publisher's retry after a lost confirm), so every consumer must absorb a second copy. The
  copy goes out right after the original, with the same message id, to every queue of its route.
- reordering (``reorder=P:W``), any message: a message is held back while up to W messages of
  *other* publishers overtake it (released at the latest when everything else due at this instant
  is done). RabbitMQ keeps one queue's order from one publisher's channel, so a publisher's later
  messages wait behind its held one: only the interleaving of different publishers changes.
- loss (``loss``) and delay (``delay=P:MAX_S``), only of messages the protocol tolerates losing
  (LOSABLE: heartbeats, the round.* observer events, status queries and replies). Everything else
  is published persistent and confirmed on RabbitMQ, so the broker never silently loses it; a
  delayed message is one its sender published late (its other messages are not held behind it).

Decisions come from one ``random.Random`` seeded by the run's fault seed, drawn in publish order
(which the virtual clock makes deterministic), five draws per message whatever is decided.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable, Sequence

from common.bus import Bus, DeadLetter, Handler, Subscription
from common.codec import id_sequence
from common.errors import UnroutableError
from common.messages import RoundEnded, RoundStarted, StatusReported, StatusRequested, WorkerHeartbeat
from common.messages.base import Message
from common.transport.memory import InMemoryBus
from sim.clock import VirtualClock
from sim.faults import FaultLog, FaultSpec

# Messages whose loss the protocol tolerates: a heartbeat is repeated (a grace spans three), the
# round events are for observers, a status query is asked again by its user.
LOSABLE: tuple[type[Message], ...] = (WorkerHeartbeat, RoundStarted, RoundEnded, StatusRequested, StatusReported)


class _Held:
    __slots__ = ("messages", "left")

    def __init__(self, left: int) -> None:
        self.messages: list[tuple[Message, dict[str, object]]] = []
        self.left = left  # publishes of other publishers that may still overtake


class FaultyBus:
    """A Bus (common.bus) over an InMemoryBus that duplicates, reorders, delays and loses."""

    def __init__(self, inner: InMemoryBus, *, clock: VirtualClock, spec: FaultSpec, rng: random.Random, log: FaultLog) -> None:
        self._inner = inner
        self._clock = clock
        self._spec = spec
        self._rng = rng
        self._log = log
        self._held: dict[str, _Held] = {}  # publisher -> its held messages, in its order
        self._tasks: set[asyncio.Task[None]] = set()
        self._new_id = id_sequence()

    # -- the Bus protocol, delegated ---------------------------------------------------------------

    @property
    def broker(self):  # noqa: ANN201 - the inner broker (dead letters, drain)
        return self._inner.broker

    @property
    def connected(self) -> bool:
        return self._inner.connected

    @property
    def user(self) -> str:
        return self._inner.user

    async def start(self) -> None:
        await self._inner.start()

    async def close(self, timeout_s: float = 30.0) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._inner.close(timeout_s)

    async def subscribe(self, queue: str, bindings: Sequence[str], handler: Handler, **kwargs: object) -> Subscription:
        return await self._inner.subscribe(queue, bindings, handler, **kwargs)  # type: ignore[arg-type]

    async def declare(self, queue: str, bindings: Sequence[str]) -> None:
        await self._inner.declare(queue, bindings)

    async def take_dead_letters(self, limit: int = 1000) -> list[DeadLetter]:
        return await self._inner.take_dead_letters(limit)

    async def consumer_count(self, queue: str) -> int | None:
        return await self._inner.consumer_count(queue)

    async def claim(self, name: str) -> None:
        await self._inner.claim(name)

    async def queue_depth(self, queue: str) -> int | None:
        return await self._inner.queue_depth(queue)

    async def dead_letter_depth(self) -> int | None:
        return await self._inner.dead_letter_depth()

    @property
    def dead_lettered(self):  # noqa: ANN201 - the inner broker's count
        return self._inner.dead_lettered

    async def publish_raw(self, routing_key: str, body: bytes, *, mandatory: bool = True) -> None:
        await self._inner.publish_raw(routing_key, body, mandatory=mandatory)  # poison: not ours to alter

    async def publish_many(
        self, messages: Iterable[Message], *, source: str | None = None, on_confirmed: Callable[[int], None] | None = None
    ) -> list[str]:
        ids = []
        for m in messages:
            ids.append(await self.publish(m, source=source))
            if on_confirmed is not None:
                on_confirmed(len(ids))
        return ids

    # -- publishing, with faults ---------------------------------------------------------------------

    async def publish(
        self,
        message: Message,
        *,
        source: str | None = None,
        correlation_id: str | None = None,
        message_id: str | None = None,
        mandatory: bool = True,
    ) -> str:
        spec = self._spec
        lose, late, double, hold, delay_draw = (self._rng.random() for _ in range(5))
        kind = type(message).__name__
        now_s = self._clock.now_s()
        publisher = source or "?"
        losable = isinstance(message, LOSABLE)
        if mandatory and not self._inner.broker.route(message.routing_key()):
            raise UnroutableError(message.routing_key())  # as the broker would, before any fault
        # an id now, so that a held or delayed message's id is the one returned (and a duplicate's)
        message_id = message_id or self._new_id()
        options: dict[str, object] = {"source": source, "correlation_id": correlation_id, "message_id": message_id}
        if losable and lose < spec.loss:
            self._log.injected("loss", now_s, kind)
            return message_id
        if losable and late < spec.delay:
            delay_s = delay_draw * spec.max_delay_s
            self._log.injected("delay", now_s, f"{kind} by {delay_s:.1f} s")
            self._spawn(self._later(delay_s, message, options, double < spec.dup))
            return message_id
        held = self._held.get(publisher)
        if held is None and hold < spec.reorder:
            self._log.injected("reorder", now_s, kind)
            held = self._held[publisher] = _Held(spec.reorder_window)
            self._spawn(self._release_at_barrier(publisher, held))
        if held is not None:  # held back, or behind this publisher's held message (its order is kept)
            held.messages.append((message, options | {"dup": double < spec.dup}))
            sent = message_id
        else:
            sent = await self._send(message, options, double < spec.dup)
        # Every publish counts against the others' windows, held or not: were held messages not to
        # count, publishers holding at once would wait for each other until the barrier.
        await self._overtaken_by(publisher)
        return sent

    async def _send(self, message: Message, options: dict[str, object], duplicate: bool) -> str:
        options = {k: v for k, v in options.items() if k != "dup"}
        # not mandatory: routability was checked when it was published (a held or delayed message's
        # queue may have gone since, as a consumer's private queue does)
        sent = await self._inner.publish(message, mandatory=False, **options)  # type: ignore[arg-type]
        if duplicate:
            self._log.injected("dup", self._clock.now_s(), type(message).__name__)
            await self._inner.publish(message, mandatory=False, **options)  # type: ignore[arg-type]  # the same id
        return sent

    async def _overtaken_by(self, publisher: str) -> None:
        """``publisher`` published: the others' held messages have one overtaker fewer."""
        for other, held in list(self._held.items()):
            if other == publisher:
                continue
            held.left -= 1
            if held.left <= 0:
                await self._release(other, held)

    async def _release(self, publisher: str, held: _Held) -> None:
        if self._held.get(publisher) is not held:
            return  # released already
        del self._held[publisher]
        for message, options in held.messages:
            await self._send(message, options, bool(options.get("dup")))

    async def _release_at_barrier(self, publisher: str, held: _Held) -> None:
        # A sleep to now returns when everything else due at this instant is done: a held message
        # never outlives its instant (nor stops virtual time).
        await self._clock.sleep(0)
        await self._release(publisher, held)

    async def _later(self, delay_s: float, message: Message, options: dict[str, object], duplicate: bool) -> None:
        await self._clock.sleep(delay_s)
        await self._send(message, options, duplicate)

    def _spawn(self, coroutine) -> None:  # noqa: ANN001
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
