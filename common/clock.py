"""The clock contract, and the wall clock. Services take a Clock; nothing reads the time or sleeps on its own, so the
same code runs on wall time or on the simulator's virtual time."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now_s(self) -> float:
        """Seconds since an epoch fixed for the clock's lifetime (Unix time for the wall clock)."""
        ...

    async def sleep(self, duration_s: float) -> None: ...


class WallClock:
    """The wall clock: Unix seconds and asyncio sleep. The simulator injects a virtual clock instead."""

    def now_s(self) -> float:
        return time.time()

    async def sleep(self, duration_s: float) -> None:
        await asyncio.sleep(max(0.0, duration_s))
