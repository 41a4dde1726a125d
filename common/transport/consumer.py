"""The consumer loop both buses share: an inbox of deliveries, N handler tasks, graceful stop.

Deliveries are pushed in arrival order and started in that order; with ``concurrency=1`` they are
also handled one at a time, which is what gives a subscription per-queue ordering. A push wakes
one idle handler task, not all of them (a subscription may run a hundred handlers to share
journal commits, and waking every one for every message would cost more than the messages).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")

# A handler that never suspends would hold the event loop for a whole backlog; yield now and
# then so other consumers, publishers and timers get a turn.
_YIELD_EVERY = 64
_STOP = object()  # tells one idle handler task to end


class ConsumerLoop(Generic[Item]):
    def __init__(self, handle: Callable[[Item], Awaitable[None]], *, concurrency: int, name: str) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self._handle = handle
        self._concurrency = concurrency
        self._name = name
        self._inbox: asyncio.Queue[object] = asyncio.Queue()
        self._stopping = False
        self._taken_after_halt: list[Item] = []  # taken from the inbox after halt(), never started
        self._tasks: list[asyncio.Task[None]] = []
        self.running = 0  # handlers in progress

    @property
    def backlog(self) -> int:
        return self._inbox.qsize()

    def start(self) -> None:
        self._tasks = [
            asyncio.get_running_loop().create_task(self._work(), name=f"{self._name}-{i}")
            for i in range(self._concurrency)
        ]

    def push(self, item: Item) -> None:
        self._inbox.put_nowait(item)

    async def _work(self) -> None:
        done = 0
        while not self._stopping:
            item = await self._inbox.get()
            if item is _STOP or self._stopping:
                if item is not _STOP:
                    self._taken_after_halt.append(item)  # type: ignore[arg-type]  # handed back by stop()
                return
            self.running += 1
            try:
                await self._handle(item)  # type: ignore[arg-type]
            finally:
                self.running -= 1
            done += 1
            if done % _YIELD_EVERY == 0:
                await asyncio.sleep(0)

    def halt(self) -> None:
        """Start no more items (those running carry on). Synchronous, so nothing slips in."""
        if self._stopping:
            return
        self._stopping = True
        for _ in self._tasks:
            self._inbox.put_nowait(_STOP)  # wakes the idle ones; busy ones see _stopping

    async def stop(self, timeout_s: float) -> list[Item]:
        """Let running handlers finish (cancelled after ``timeout_s``); return the unstarted items,
        in the order they arrived."""
        self.halt()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=timeout_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        left: list[Item] = list(self._taken_after_halt)  # taken first, so they come first
        self._taken_after_halt.clear()
        while not self._inbox.empty():
            item = self._inbox.get_nowait()
            if item is not _STOP:
                left.append(item)  # type: ignore[arg-type]
        return left
