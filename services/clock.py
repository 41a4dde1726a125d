"""The wall clock: Unix seconds and asyncio sleep. The simulator injects a virtual clock instead."""

from __future__ import annotations

import asyncio
import time


class WallClock:
    def now_s(self) -> float:
        return time.time()

    async def sleep(self, duration_s: float) -> None:
        await asyncio.sleep(max(0.0, duration_s))
