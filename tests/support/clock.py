"""The fake clock of tests that run a live service in one process (tests/service, tests/cli).

Time moves only when the test moves it; nothing sleeps in wall time. (A whole simulation runs on
sim.clock.VirtualClock instead, which moves by itself once nothing is in flight.)
"""

from __future__ import annotations

import asyncio


class SteppedClock:
    """Live time that moves only when the test moves it (``advance``); a sleep ends once time has
    passed its end, so a sleeper the test never advances past waits until it is cancelled.
    ``now_s`` is also the plain ``() -> float`` clock of what takes one (a progress bar)."""

    def __init__(self, now_s: float = 1000.0) -> None:
        self.t = now_s
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def now_s(self) -> float:
        return self.t

    async def sleep(self, duration_s: float) -> None:
        if duration_s <= 0:
            await asyncio.sleep(0)
            return
        entry = (self.t + duration_s, asyncio.get_running_loop().create_future())
        self._sleepers.append(entry)
        try:
            await entry[1]
        finally:
            self._sleepers.remove(entry)

    def advance(self, duration_s: float) -> None:
        self.t += duration_s
        for due_s, future in self._sleepers:
            if due_s <= self.t and not future.done():
                future.set_result(None)
