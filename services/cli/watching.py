"""What `gavel events` and `gavel top` share: a connection to the broker, status queries asked over
one private reply queue (a view that asks every second would otherwise declare and delete a queue
per question), the cluster's events as they are published, and an event as one line for people.

Events come from the mechanism (mechanism_service/core/events.py): its status query ``events``
answers the recent ones (a ring of the last 1,000), and ``event.<kind>`` carries each new one
(ClusterEvent) to whoever listens, on a queue of its own that goes away with the command.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import re
import signal
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from services.cli.common import CommandFailed, open_bus  # noqa: F401 - open_bus: what events and top connect with

if TYPE_CHECKING:
    from common.bus import Bus, Subscription
    from common.messages import ClusterEvent
    from services.cli.times import ClockView

_SINCE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d)?\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def since_seconds(raw: str) -> float:
    """``--since``: ``90``, ``90s``, ``10m``, ``2h``, ``1d`` -> seconds (a flag type: refused at parse)."""
    found = _SINCE.match(raw)
    if found is None:
        raise argparse.ArgumentTypeError(f"must be a duration like 90s, 10m, 2h or 1d, got {raw!r}")
    return float(found.group(1)) * _UNIT_S[found.group(2)]


class Asker:
    """Status queries, any number of them, over one private reply queue."""

    def __init__(self, bus: Bus) -> None:
        from services.cli.replies import Replies

        self._bus = bus
        self._replies = Replies(bus)
        self._asked = 0

    async def __aenter__(self) -> Asker:
        await self._replies.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._replies.__aexit__(*exc)

    async def ask(self, queries: Mapping[str, tuple[str, str, int]], timeout_s: float) -> dict[str, object]:
        """Every query at once (name -> (query, job id, limit)), then every answer: name -> answer."""
        from common.errors import UnroutableError
        from common.messages import StatusRequested

        ids = {}
        for name, (query, job_id, limit) in queries.items():
            self._asked += 1
            ids[name] = f"{self._replies.key}-{self._asked}"
            try:
                await self._bus.publish(StatusRequested(ids[name], query, self._replies.key, job_id, limit))
            except UnroutableError:
                raise CommandFailed("the mechanism is not running (nothing receives status requests)") from None
        try:
            answers = await asyncio.wait_for(
                asyncio.gather(*(self._replies.wait(request_id, timeout_s) for request_id in ids.values())), timeout_s
            )
        except TimeoutError:
            raise CommandFailed(f"no answer from the mechanism within {timeout_s:g} s: is it running?") from None
        return dict(zip(ids, answers, strict=True))


class Seen:
    """Event ids said already (the recent ones, then each live one once: a restarted mechanism,
    or the answer and the stream overlapping, say some twice); the newest ``size`` kept."""

    def __init__(self, size: int = 10_000) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._size = size

    def forget(self) -> None:
        """A new incarnation of the mechanism: its events are new whatever their ids (one without a
        journal numbers its rounds and epochs from the start again)."""
        self._ids.clear()

    def first_time(self, event_id: str) -> bool:
        if event_id in self._ids:
            return False
        self._ids[event_id] = None
        if len(self._ids) > self._size:
            self._ids.popitem(last=False)
        return True


async def follow(bus: Bus, on_event: Callable[[ClusterEvent], Awaitable[None]]) -> Subscription:
    """Every event the mechanism publishes from now on, into ``on_event``, on a private queue
    (exclusive, deleted with the connection) bound to ``event.*``."""
    from common.bus import Delivery
    from common.messages import ClusterEvent
    from common.topics import binding_pattern

    async def handler(d: Delivery) -> None:
        if isinstance(d.message, ClusterEvent):
            await on_event(d.message)

    return await bus.subscribe(f"cli.{uuid.uuid4().hex[:12]}.events", [binding_pattern(ClusterEvent)], handler, durable=False)


def event_dict(event: ClusterEvent) -> dict[str, object]:
    """A live event as the status query answers one (its JSON form)."""
    return {
        "id": event.event_id, "kind": event.kind, "time_s": event.time_s, "round_id": event.round_id,
        "job_id": event.job_id or None, "worker_id": event.worker_id or None,
        "accelerator_type": event.accelerator_type or None, "detail": event.detail,
    }


def stamp(time_s: float, clock: ClockView | None, *, short: bool = False) -> str:
    """When, for people: local wall time (``2026-11-28 14:03:07``; ``14:03:07`` short) where the
    mechanism's clock is tied to the wall, else the mechanism's time since its start (``t+3 h 12 min``)."""
    from services.cli.times import duration

    wall = clock.wall_time(time_s) if clock is not None else None
    if wall is None:
        return f"t+{duration(time_s)}"
    return datetime.datetime.fromtimestamp(wall).strftime("%H:%M:%S" if short else "%Y-%m-%d %H:%M:%S")


def event_line(event: Mapping[str, object], clock: ClockView | None, *, short: bool = False) -> str:
    """``2026-11-28 14:03:07  round 12   placed             job-3  started on v100 on w1 (1 GPU)``;
    ``short`` (`gavel top`): ``14:03:07 #12  placed             job-3  started on ...``."""
    subject = event.get("job_id") or event.get("worker_id") or ""
    detail = str(event.get("detail") or "")
    when = stamp(float(event["time_s"]), clock, short=short)  # type: ignore[arg-type]
    round_id = f"#{event['round_id']:<4}" if short else f" round {event['round_id']:<4}"
    said = f"{subject}  {detail}" if subject and detail else subject or detail
    return f"{when} {round_id} {event['kind']:<18} {said}".rstrip()


async def until_interrupted(work: Awaitable[object] | None = None) -> None:
    """Wait for Ctrl-C or SIGTERM (or ``work`` to end): a watcher's normal way out, exit 0 and no
    traceback."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        waiters = [asyncio.ensure_future(stop.wait())]
        if work is not None:
            waiters.append(asyncio.ensure_future(work))
        done, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for task in done:
            task.result()  # a failure of the work is said
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
