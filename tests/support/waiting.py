"""Waiting on conditions, never on the passage of time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from common.bus import Delivery


class Collector:
    """A handler that records deliveries and lets a test wait until a condition holds."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self._changed = asyncio.Condition()

    async def __call__(self, delivery: Delivery) -> None:
        async with self._changed:
            self.deliveries.append(delivery)
            self._changed.notify_all()

    @property
    def messages(self) -> list[object]:
        return [d.message for d in self.deliveries]

    async def wait_for_count(self, n: int, timeout_s: float = 20.0) -> list[Delivery]:
        await self.wait_until(lambda: len(self.deliveries) >= n, timeout_s)
        return self.deliveries

    async def wait_until(self, predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
        async def wait() -> None:
            async with self._changed:
                await self._changed.wait_for(predicate)

        await asyncio.wait_for(wait(), timeout_s)


async def eventually(predicate: Callable[[], object], timeout_s: float = 20.0, poll_s: float = 0.01) -> None:
    """Poll ``predicate`` until it is truthy (for state outside our control: a broker, a process)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise TimeoutError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(poll_s)


async def until(check: Callable[[], Awaitable[object]], timeout_s: float, poll_s: float = 0.05) -> None:
    """Poll an async ``check`` (the broker's state: nothing to wait on) until it is truthy."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await check():
        if loop.time() > deadline:
            raise TimeoutError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(poll_s)
