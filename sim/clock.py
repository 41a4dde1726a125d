"""VirtualClock: simulated time that advances only when the system has nothing left to do now.

Services sleep on it as on the wall clock (``await clock.sleep(s)``). The driver calls
``run_until(done)``: it lets every delivery in flight be handled (including the messages those
handlers publish), lets every task that is ready run, and only then jumps time to the earliest
sleeper and wakes it (sleepers due at the same instant wake in the order they went to sleep, so a
run is deterministic). A thousand virtual hours take as long as the work done in them.

One rule keeps quiescence well defined: a bus handler must not sleep on the clock itself (its
delivery would stay in flight, so time could never advance); it starts a task that sleeps.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from common.errors import GavelError

if TYPE_CHECKING:  # annotations only: the fast path imports this module for SimulationStalled
    from common.transport.memory import InMemoryBroker


class SimulationStalled(GavelError):
    """Nothing is in flight, nobody sleeps, and the run is not done: it can never finish."""


class VirtualClock:
    def __init__(self, broker: InMemoryBroker, start_s: float = 0.0) -> None:
        self._broker = broker
        self._now_s = float(start_s)
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now_s(self) -> float:
        return self._now_s

    async def sleep(self, duration_s: float) -> None:
        await self.sleep_until(self._now_s + max(0.0, duration_s))

    async def sleep_until(self, time_s: float) -> None:
        if not math.isfinite(time_s):
            raise ValueError(f"cannot sleep until {time_s}")
        # A sleep to "now" is a barrier: it returns once everything else due at this instant
        # (deliveries, tasks) has been done, which is what "at the same time" means here.
        time_s = max(time_s, self._now_s)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (time_s, next(self._order), future))
        await future

    @property
    def next_wakeup_s(self) -> float | None:
        while self._sleepers and self._sleepers[0][2].cancelled():
            heapq.heappop(self._sleepers)
        return self._sleepers[0][0] if self._sleepers else None

    async def settle(self) -> None:
        """Return when no delivery is in flight and no task has anything left to do now."""
        while True:
            before = (self._broker.activity, len(self._sleepers))
            await self._broker.drain(timeout_s=None)
            # Tasks woken by the last deliveries (or by a sleeper released just now) need a few
            # turns of the loop to run to their next await.
            for _ in range(4):
                await asyncio.sleep(0)
            if self._broker.idle and before == (self._broker.activity, len(self._sleepers)):
                return

    async def run_until(self, done: Callable[[], bool], *, max_time_s: float = math.inf) -> None:
        """Advance time, sleeper by sleeper, until ``done()`` or ``max_time_s``."""
        while True:
            await self.settle()
            if done():
                return
            wake_s = self.next_wakeup_s
            if wake_s is not None and wake_s <= self._now_s:
                self._release(self._now_s)
                continue
            if wake_s is None:
                raise SimulationStalled(f"nothing in flight and nobody asleep at t={self._now_s:.1f} s, but not done")
            if wake_s > max_time_s:
                self._now_s = max_time_s
                return
            self._now_s = wake_s
            self._release(wake_s)

    def _release(self, up_to_s: float) -> None:
        while self._sleepers and self._sleepers[0][0] <= up_to_s:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.cancelled():
                future.set_result(None)
