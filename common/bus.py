"""The bus contract every transport implements (InMemoryBus, RabbitBus). Protocols only.

Semantics (the contract tests in tests/contract hold every implementation to them):
- One topic exchange. ``publish`` routes a message by its routing key to every queue whose
  binding pattern matches (``*`` = one word, ``#`` = zero or more). A mandatory publish that
  matches no queue raises ``UnroutableError`` instead of vanishing.
- A queue is named by the subscriber. Subscribers of the same queue compete (each message goes
  to one of them); each distinct queue gets its own copy. Messages in one queue are delivered in
  publish order; with ``concurrency=1`` a subscription handles them in that order.
- A delivery is acknowledged after its handler returns. A handler that raises, and a body that
  does not decode, are dead-lettered with the reason; the subscription keeps consuming.
- A message whose consumer dies before acknowledging it is delivered again (``redelivered``).
- ``Subscription.cancel`` stops new deliveries, lets running handlers finish, and hands messages
  prefetched but not started back to the queue.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Protocol

from common.codec import Envelope
from common.messages.base import Message


@dataclasses.dataclass(frozen=True, slots=True)
class Delivery:
    """One message handed to a handler."""

    message: Message
    envelope: Envelope
    routing_key: str
    queue: str
    redelivered: bool = False
    # The wire bytes as received, where the transport had them (b"" when messages travel as
    # objects): a consumer that keeps a message (the mechanism's journal) stores these instead of
    # encoding it again.
    body: bytes = b""
    # The broker user that published it, as the broker validated it (RabbitMQ refuses a user-id
    # property that is not the publishing connection's user); "" when the transport does not say.
    user_id: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message that could not be handled, with why. ``body`` is the wire bytes as received."""

    queue: str
    routing_key: str
    body: bytes
    reason: str


Handler = Callable[[Delivery], Awaitable[None]]


class Subscription(Protocol):
    @property
    def queue(self) -> str: ...

    @property
    def active(self) -> bool:
        """Attached and receiving deliveries."""
        ...

    async def cancel(self, timeout_s: float = 30.0) -> None:
        """Stop receiving; wait (up to ``timeout_s``) for running handlers; requeue the rest."""
        ...


class Bus(Protocol):
    @property
    def connected(self) -> bool: ...

    # Messages this connection dead-lettered, per queue (its short name), since it was made: the
    # host counts them for each service's queues (gavel_messages_dead_lettered_total).
    dead_lettered: collections.Counter[str]

    # The broker user this connection logs in as and publishes under ("" when none): receivers
    # get it as Delivery.user_id, as the broker validated it.
    user: str

    async def start(self) -> None: ...

    async def close(self) -> None:
        """Cancel every subscription gracefully, then release the transport."""
        ...

    async def publish(
        self,
        message: Message,
        *,
        source: str | None = None,
        correlation_id: str | None = None,
        message_id: str | None = None,
        mandatory: bool = True,
    ) -> str:
        """Publish (durably, confirmed where the transport can) and return the message id."""
        ...

    async def publish_many(
        self,
        messages: Iterable[Message],
        *,
        source: str | None = None,
        on_confirmed: Callable[[int], None] | None = None,
    ) -> list[str]:
        """Publish many with several in flight at once; returns their ids in order.
        ``on_confirmed(n)`` is called as confirms come in, with how many so far (progress bars)."""
        ...

    async def publish_raw(self, routing_key: str, body: bytes, *, mandatory: bool = True) -> None:
        """Publish bytes as they are (tools and fault tests: the receiver decodes them)."""
        ...

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
        """Consume ``queue`` (declared and bound to ``bindings`` if needed).

        ``durable=True``: a shared work queue that outlives its consumers (service queues).
        ``durable=False``: a private queue deleted when its last consumer leaves (observers).
        """
        ...

    async def declare(self, queue: str, bindings: Sequence[str]) -> None:
        """Make sure the durable queue exists and is bound, without consuming it: a producer that
        must not lose messages while their consumer is down declares the consumer's queue."""
        ...

    async def take_dead_letters(self, limit: int = 1000) -> list[DeadLetter]:
        """Remove and return up to ``limit`` dead letters, oldest first."""
        ...

    async def consumer_count(self, queue: str) -> int | None:
        """How many consumers ``queue`` has now; None when it does not exist. A message published
        to a queue that exists but has no consumer waits there silently: a caller that expects
        an answer can say at once that nobody is listening."""
        ...

    async def queue_depth(self, queue: str) -> int | None:
        """Messages ready in ``queue`` (waiting, not yet handed to a consumer); None when it does
        not exist or the broker does not say. Metrics read it every few seconds."""
        ...

    async def dead_letter_depth(self) -> int | None:
        """Messages waiting in the dead-letter queue; None when the broker does not say."""
        ...

    async def claim(self, name: str) -> None:
        """Hold ``name`` for as long as this connection lives, or raise ``NameClaimedError`` when
        another live connection holds it. The broker keeps the claim (RabbitMQ: an exclusive
        queue), so it cannot outlive a process that died, and two processes cannot both hold it:
        a worker claims its id before it consumes its commands."""
        ...
