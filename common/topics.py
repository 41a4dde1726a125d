"""Routing keys <-> message classes, and AMQP topic matching.

Topic semantics (AMQP 0-9-1, as RabbitMQ implements them): keys and patterns are dot-separated
words; in a pattern ``*`` matches exactly one word and ``#`` matches zero or more words, so
``a.#`` matches ``a``, ``a.b`` and ``a.b.c``, while ``a.*`` matches only ``a.b``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping

from common.errors import SubscriptionError
from common.messages import (
    AllocationComputed,
    AllocationFailed,
    AllocationRequested,
    CancelJob,
    ClusterEvent,
    ExtendLease,
    GangRendezvous,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobProgress,
    JobRejected,
    JobSubmitted,
    KillJobs,
    LogsReported,
    LogsRequested,
    Message,
    RoundEnded,
    RoundStarted,
    RunJobs,
    StatusReported,
    StatusRequested,
    SubmissionsSealed,
    SweepCellFinished,
    SweepCellRequested,
    SweepCellStarted,
    ThroughputEstimated,
    WorkerFenced,
    WorkerRefused,
    WorkerHeartbeat,
    WorkerIdInUse,
    WorkerRegistered,
)

#: Every message type that travels on the bus (docs/ARCHITECTURE.md, "Messages and the wire").
MESSAGE_TYPES: tuple[type[Message], ...] = (
    JobSubmitted,
    SubmissionsSealed,
    CancelJob,
    JobRejected,
    JobCompleted,
    JobFailed,
    JobCancelled,
    JobProgress,
    WorkerRegistered,
    WorkerHeartbeat,
    WorkerIdInUse,
    RunJobs,
    ExtendLease,
    KillJobs,
    GangRendezvous,
    WorkerFenced,
    WorkerRefused,
    AllocationRequested,
    AllocationComputed,
    AllocationFailed,
    ThroughputEstimated,
    RoundStarted,
    RoundEnded,
    StatusRequested,
    StatusReported,
    ClusterEvent,
    LogsRequested,
    LogsReported,
    SweepCellRequested,
    SweepCellStarted,
    SweepCellFinished,
)

#: The policy replicas' shared request queue (below the exchange). Named here because the
#: mechanism asks the broker whether anyone consumes it, and service packages do not import
#: each other.
POLICY_REQUEST_QUEUE = "policy.allocation-requests"

_PLACEHOLDER = re.compile(r"\{[^{}]*\}")


def binding_pattern(cls: type[Message]) -> str:
    """The pattern that receives every message of ``cls``: placeholders become ``*``."""
    return _PLACEHOLDER.sub("*", cls.ROUTING_KEY)


def registry(types: Iterable[type[Message]] = MESSAGE_TYPES) -> Mapping[str, type[Message]]:
    """Schema name -> class. Two classes with one schema name are an error."""
    table: dict[str, type[Message]] = {}
    for cls in types:
        if cls.SCHEMA in table:
            raise ValueError(f"duplicate message schema {cls.SCHEMA!r}")
        table[cls.SCHEMA] = cls
    return table


def classes_for_key(routing_key: str, types: Iterable[type[Message]] = MESSAGE_TYPES) -> list[type[Message]]:
    """The message classes whose routing key pattern matches a concrete key."""
    return [cls for cls in types if topic_matches(binding_pattern(cls), routing_key)]


def check_subscription(queue: str, bindings: Iterable[str]) -> None:
    """SubscriptionError for an empty queue name or a binding pattern a broker would misroute."""
    if not queue:
        raise SubscriptionError("queue name must not be empty")
    try:
        for pattern in bindings:
            validate_pattern(pattern)
    except ValueError as e:
        raise SubscriptionError(str(e)) from None


def validate_pattern(pattern: str) -> None:
    """Refuse patterns RabbitMQ would route surprisingly (empty words, wildcards inside words)."""
    if not pattern or len(pattern) > 255:
        raise ValueError(f"routing pattern must be 1..255 characters, got {pattern!r}")
    for word in pattern.split("."):
        if word == "" or (("*" in word or "#" in word) and word not in ("*", "#")):
            raise ValueError(f"bad routing pattern {pattern!r}: word {word!r}")


@functools.lru_cache(maxsize=4096)
def _compiled(pattern: str) -> tuple[str, ...]:
    return tuple(pattern.split("."))


def topic_matches(pattern: str, routing_key: str) -> bool:
    """AMQP topic match of ``routing_key`` against ``pattern``."""
    return _match(_compiled(pattern), 0, tuple(routing_key.split(".")) if routing_key else (), 0)


def _match(pat: tuple[str, ...], i: int, key: tuple[str, ...], j: int) -> bool:
    while i < len(pat):
        word = pat[i]
        if word == "#":
            # '#' swallows zero or more words: try every split point.
            return any(_match(pat, i + 1, key, k) for k in range(j, len(key) + 1))
        if j >= len(key) or (word != "*" and word != key[j]):
            return False
        i += 1
        j += 1
    return j == len(key)
