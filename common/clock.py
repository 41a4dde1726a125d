"""The clock contract. Services take a Clock; nothing reads the time or sleeps on its own, so the
same code runs on wall time or on the simulator's virtual time."""

from __future__ import annotations

from typing import Protocol


class Clock(Protocol):
    def now_s(self) -> float:
        """Seconds since an epoch fixed for the clock's lifetime (Unix time for the wall clock)."""
        ...

    async def sleep(self, duration_s: float) -> None: ...
