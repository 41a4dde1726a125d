"""The consumer loop both buses share: an inbox of deliveries, N handler tasks, graceful stop.

Deliveries are pushed in arrival order and started in that order; with ``concurrency=1`` they are
also handled one at a time, which is what gives a subscription per-queue ordering.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")

# A handler that never suspends would hold the event loop for a whole backlog; yield now and
# then so other consumers, publishers and timers get a turn.
_YIELD_EVERY = 64


class ConsumerLoop(Generic[Item]):
    def __init__(self, handle: Callable[[Item], Awaitable[None]], *, concurrency: int, name: str) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self._handle = handle
        self._concurrency = concurrency
        self._name = name
        self._inbox: collections.deque[Item] = collections.deque()
        self._wake = asyncio.Event()
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self.running = 0  # handlers in progress

    @property
    def backlog(self) -> int:
        return len(self._inbox)

    def start(self) -> None:
        self._tasks = [
            asyncio.get_running_loop().create_task(self._work(), name=f"{self._name}-{i}")
            for i in range(self._concurrency)
        ]

    def push(self, item: Item) -> None:
        self._inbox.append(item)
        self._wake.set()

    async def _work(self) -> None:
        done = 0
        while True:
            while not self._inbox:
                if self._stopping:
                    return
                self._wake.clear()
                await self._wake.wait()
            if self._stopping:
                return
            item = self._inbox.popleft()
            self.running += 1
            try:
                await self._handle(item)
            finally:
                self.running -= 1
            done += 1
            if done % _YIELD_EVERY == 0:
                await asyncio.sleep(0)

    def halt(self) -> None:
        """Start no more items (those running carry on). Synchronous, so nothing slips in."""
        self._stopping = True
        self._wake.set()

    async def stop(self, timeout_s: float) -> list[Item]:
        """Let running handlers finish (cancelled after ``timeout_s``); return the unstarted items."""
        self.halt()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=timeout_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        left = list(self._inbox)
        self._inbox.clear()
        return left
