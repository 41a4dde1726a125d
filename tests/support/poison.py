"""Hostile input at service processes over RabbitMQ: the keys their queues are bound to (as the
broker lists them), the poison for each key, publishing it raw, and reading the dead letters back.

The bindings come from `rabbitmqctl list_bindings` (AMQP cannot list them, and the management
plugin may be off), so the broker must be a local one with rabbitmqctl beside it: what `make
broker` and CI start (scripts/ensure-broker)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import urllib.parse
import zlib
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

import aio_pika

from common.bus import DeadLetter
from common.messages.base import Message
from common.topics import MESSAGE_TYPES, binding_pattern, topic_matches
from common.transport.rabbit import QUEUE_HEADER, REASON_HEADER, RabbitBus
from tests.support.fuzz import hostile_bodies, poison_for
from tests.support.waiting import until

LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


def bindings_problem(url: str) -> str | None:
    """Why the broker's bindings cannot be listed from here (None: they can)."""
    host = urllib.parse.urlparse(url).hostname or "127.0.0.1"
    if host not in LOCAL_HOSTS:
        return f"the broker at {host} is not local: rabbitmqctl cannot list its bindings from here"
    if shutil.which("rabbitmqctl") is None:
        return "rabbitmqctl is not on PATH: it lists the broker's bindings (the local broker's own tool)"
    return None


def broker_bindings(url: str, exchange: str) -> dict[str, frozenset[str]]:
    """Queue (its name below ``exchange``) -> the patterns it is bound with on ``exchange``."""
    vhost = urllib.parse.unquote(urllib.parse.urlparse(url).path[1:]) or "/"
    done = subprocess.run(
        ["rabbitmqctl", "-q", "list_bindings", "-p", vhost, "--formatter", "json",
         "source_name", "routing_key", "destination_name", "destination_kind"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, f"rabbitmqctl list_bindings failed: {done.stderr.strip()}"
    bound: dict[str, set[str]] = {}
    prefix = f"{exchange}."
    for row in json.loads(done.stdout or "[]"):
        if row["source_name"] != exchange or row["destination_kind"] != "queue":
            continue
        queue = str(row["destination_name"])
        assert queue.startswith(prefix), queue
        bound.setdefault(queue.removeprefix(prefix), set()).add(str(row["routing_key"]))
    return {queue: frozenset(patterns) for queue, patterns in bound.items()}


def keys_of(pattern: str, types: Iterable[type[Message]] = MESSAGE_TYPES) -> set[str]:
    """The concrete routing keys a binding receives messages under: the pattern itself if it has
    no wildcard, else every message type's key that it matches, its placeholders taken from the
    pattern (``worker.cmd.v100-0.*`` -> ``worker.cmd.v100-0.run``, ``...extend``, ...)."""
    words = pattern.split(".")
    if "#" in words:
        raise ValueError(f"cannot expand {pattern!r}: no service binds '#'")
    if "*" not in words:
        return {pattern}
    keys = set()
    for cls in types:
        template = cls.ROUTING_KEY.split(".")
        if len(template) != len(words):
            continue
        key = [t if w == "*" else w for w, t in zip(words, template, strict=True)]
        candidate = ".".join(key)
        if "{" not in candidate and topic_matches(pattern, candidate) and topic_matches(binding_pattern(cls), candidate):
            keys.add(candidate)
    return keys


def routed(key: str, bindings: Mapping[str, frozenset[str]]) -> list[str]:
    """The queues a message under ``key`` lands on (one copy each, however many patterns match)."""
    return sorted(queue for queue, patterns in bindings.items() if any(topic_matches(p, key) for p in patterns))


def poison(patterns: Iterable[str], per_binding: int) -> dict[str, list[bytes]]:
    """Routing key -> its poison: ``per_binding`` hostile bodies for each binding pattern (seeded
    by the pattern), a wildcard binding's spread in turn over its keys (keys_of), less those that
    are well-formed messages of the key they go to: those are input, not poison."""
    out: dict[str, list[bytes]] = {}
    for pattern in sorted(set(patterns)):
        keys = sorted(keys_of(pattern))
        for i, body in enumerate(hostile_bodies(per_binding, seed=zlib.crc32(pattern.encode()))):
            key = keys[i % len(keys)]
            out.setdefault(key, []).extend(poison_for(key, [body]))
    return dict(sorted(out.items()))


async def publish_raw_many(
    bus: RabbitBus,
    key: str,
    bodies: Sequence[bytes],
    window: int = 512,
    before_window: Callable[[int], Awaitable[None]] | None = None,
) -> None:
    """Raw bodies on ``key``, mandatory (an unbound key raises), ``window`` confirms outstanding;
    ``before_window(n)`` is awaited before each window of ``n`` (room in a bounded queue)."""
    for start in range(0, len(bodies), window):
        chunk = bodies[start : start + window]
        if before_window is not None:
            await before_window(len(chunk))
        await asyncio.gather(*(bus.publish_raw(key, body) for body in chunk))


class QueueDepths:
    """Messages ready in the queues below ``exchange`` (passive declarations on one channel)."""

    def __init__(self, url: str, exchange: str) -> None:
        self._url = url
        self._exchange = exchange
        self._connection: aio_pika.abc.AbstractConnection | None = None
        self._channel: aio_pika.abc.AbstractChannel | None = None

    async def __aenter__(self) -> QueueDepths:
        self._connection = await aio_pika.connect(self._url)
        self._channel = await self._connection.channel()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._connection is not None
        await self._connection.close()

    async def of(self, queue: str) -> int:
        assert self._channel is not None
        declared = await self._channel.declare_queue(f"{self._exchange}.{queue}", passive=True)
        return int(declared.declaration_result.message_count or 0)

    async def room_for(self, queue: str, n: int, bound: int, timeout_s: float = 120.0) -> None:
        """Until ``n`` more fit below ``bound`` (the caller is the queue's only publisher)."""

        async def fits() -> bool:
            return await self.of(queue) + n <= bound

        await until(fits, timeout_s)


async def take_all_dead_letters(url: str, exchange: str, n: int, timeout_s: float = 120.0) -> list[DeadLetter]:
    """The ``n`` dead letters waiting, taken with a consumer (RabbitBus.take_dead_letters gets one
    per round trip: minutes for a few hundred thousand)."""
    connection = await aio_pika.connect(url)
    out: list[DeadLetter] = []
    done = asyncio.Event()

    def text(value: object) -> str:
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else "" if value is None else str(value)

    async def on_letter(incoming: aio_pika.abc.AbstractIncomingMessage) -> None:
        headers = incoming.headers or {}
        reason, queue = text(headers.get(REASON_HEADER)), text(headers.get(QUEUE_HEADER))
        out.append(DeadLetter(queue, incoming.routing_key or "", bytes(incoming.body), reason))
        if len(out) >= n:
            done.set()

    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=2000)
        queue = await channel.declare_queue(f"{exchange}.dead-letters", passive=True)
        if n:
            await queue.consume(on_letter, no_ack=True)
            await asyncio.wait_for(done.wait(), timeout_s)
    finally:
        await connection.close()
    return out
