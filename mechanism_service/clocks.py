"""Clocks a mechanism process can run on besides the wall clock.

- ScaledClock: wall time sped up (``--time-scale 100``: a 360 s round lasts 3.6 s), for a fake
  fleet that sleeps through its leases at the same speed.
- LockstepClock: time that only moves when the mechanism moves it, to a round's end (when every
  lease has reported) or to the next submitted job's arrival; across processes it makes the same
  schedule as the in-process simulator.
"""

from __future__ import annotations

import asyncio
import time

from common.clock import WallClock


def describe_clock(clock: object, *, lockstep: bool = False) -> str:
    """How a process times its rounds and leases, for a mechanism and its workers to compare
    (WorkerRegistered.clock): "wall", "scaled x100", "lockstep"; "" for a clock one process
    shares with everything it talks to (the simulator's virtual clock: nothing to compare)."""
    if lockstep or isinstance(clock, LockstepClock):
        return "lockstep"
    if isinstance(clock, ScaledClock):
        return f"scaled x{clock.scale:g}"
    if isinstance(clock, WallClock):
        return "wall"
    return ""


class ScaledClock:
    def __init__(self, scale: float, start_s: float = 0.0) -> None:
        if scale <= 0:
            raise ValueError(f"time scale must be positive, got {scale}")
        self._scale = scale
        self._origin_wall = time.monotonic()
        self._start_s = start_s

    @property
    def scale(self) -> float:
        return self._scale

    def now_s(self) -> float:
        return self._start_s + (time.monotonic() - self._origin_wall) * self._scale

    async def sleep(self, duration_s: float) -> None:
        await asyncio.sleep(max(0.0, duration_s) / self._scale)

    def advance_to(self, time_s: float) -> None:
        """Never earlier than ``time_s`` from now on (a restarted process resumes its journal's
        time; the time it was down is not counted)."""
        behind_s = time_s - self.now_s()
        if behind_s > 0:
            self._start_s += behind_s


class LockstepClock:
    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = start_s

    def now_s(self) -> float:
        return self._now_s

    def advance_to(self, time_s: float) -> None:
        self._now_s = max(self._now_s, time_s)

    async def sleep(self, duration_s: float) -> None:
        # Nobody waits on lockstep time: it moves when the mechanism moves it.
        self.advance_to(self._now_s + max(0.0, duration_s))
        await asyncio.sleep(0)


def clock_basis(clock: object, *, lockstep: bool, now_s: float, wall_s: float) -> dict[str, object]:
    """What the command line needs to show the mechanism's times to a person: the clock's kind
    (``wall``: Unix seconds; ``scaled``: wall time x ``scale`` since the mechanism began;
    ``lockstep`` and ``virtual``: time that moves with the work, tied to no wall time), its
    scale, and the mechanism's now beside the wall's (Unix seconds) at the moment of the answer:
    a mechanism time t is the wall's ``wall_s + (t - now_s) / scale``."""
    if lockstep or isinstance(clock, LockstepClock):
        kind, scale = "lockstep", None
    elif isinstance(clock, ScaledClock):
        kind, scale = "scaled", clock.scale
    elif isinstance(clock, WallClock):
        kind, scale = "wall", 1.0
    else:
        kind, scale = "virtual", None
    return {"kind": kind, "scale": scale, "now_s": now_s, "wall_s": wall_s}
