"""Times a person reads: the mechanism's times as local dates, its durations as "3 h 12 min", in
wall time whatever clock the mechanism runs on (`--json` keeps the mechanism's seconds).

The mechanism's clock is the wall (Unix seconds), scaled (`--time-scale N`: N mechanism seconds a
wall second, counted from the mechanism's start) or lockstep (time that moves with the work, tied
to no wall time). Its answers carry the clock's basis (``clock``: kind, scale, the mechanism's now
and the wall's when it answered: mechanism_service/clocks.py, ``clock_basis``), from which a
mechanism time t is the wall's ``wall_s + (t - now_s) / scale``. On a lockstep (or virtual) clock
there is no wall time to give: times print as the mechanism's, ``t+3 h 12 min``.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping
from dataclasses import dataclass


def duration(seconds: float | None) -> str:
    """``0.4 s``, ``1.8 s``, ``45 s``, ``12 min``, ``3 h 12 min``, ``2 d 4 h``; ``-`` for None."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    sign = "-" if seconds < 0 else ""
    s = abs(seconds)
    if s < 10:
        return f"{sign}{s:.1f} s"
    if s < 60:
        return f"{sign}{s:.0f} s"
    minutes = int(s // 60)
    if minutes < 60:
        return f"{sign}{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{sign}{hours} h {minutes} min" if minutes else f"{sign}{hours} h"
    days, hours = divmod(hours, 24)
    return f"{sign}{days} d {hours} h" if hours else f"{sign}{days} d"


@dataclass(frozen=True, slots=True)
class ClockView:
    """A mechanism's clock as it answered: converts its times and durations to the wall's."""

    kind: str  # wall, scaled, lockstep, virtual ("": unknown: an older mechanism)
    scale: float | None
    now_s: float
    wall_s: float | None

    @classmethod
    def of(cls, block: object) -> ClockView | None:
        if not isinstance(block, Mapping) or "now_s" not in block:
            return None
        scale = block.get("scale")
        wall = block.get("wall_s")
        return cls(
            str(block.get("kind", "")), float(scale) if scale else None, float(block["now_s"]),  # type: ignore[arg-type]
            float(wall) if wall is not None else None,  # type: ignore[arg-type]
        )

    @property
    def tied_to_wall(self) -> bool:
        return self.scale is not None and self.wall_s is not None

    def wall_duration(self, mechanism_s: float | None) -> float | None:
        """A mechanism duration in wall seconds (itself where the clock is tied to none)."""
        if mechanism_s is None:
            return None
        return mechanism_s / self.scale if self.tied_to_wall else mechanism_s  # type: ignore[operator]

    def wall_time(self, mechanism_t: float) -> float | None:
        if not self.tied_to_wall:
            return None
        return self.wall_s + (mechanism_t - self.now_s) / self.scale  # type: ignore[operator]

    def date(self, mechanism_t: float | None) -> str:
        """``2026-11-28 14:03`` (local time; with seconds when within the minute of now), or
        ``t+3 h 12 min`` on a clock tied to no wall time."""
        if mechanism_t is None:
            return "-"
        wall = self.wall_time(mechanism_t)
        if wall is None:
            return f"t+{duration(mechanism_t)}"
        when = datetime.datetime.fromtimestamp(wall)
        near = abs(wall - self.wall_s) < 60  # type: ignore[operator]
        return when.strftime("%Y-%m-%d %H:%M:%S" if near else "%Y-%m-%d %H:%M")

    def until(self, mechanism_t: float | None) -> str:
        """``in 3 h 12 min`` (wall), ``3 min ago`` for a time past."""
        if mechanism_t is None:
            return "-"
        left = self.wall_duration(mechanism_t - self.now_s)
        assert left is not None
        return f"in {duration(left)}" if left >= 0 else f"{duration(-left)} ago"

    def ago(self, mechanism_s: float | None) -> str:
        """``1.8 s ago``: a mechanism duration back from now, in wall seconds."""
        if mechanism_s is None:
            return "-"
        return f"{duration(self.wall_duration(mechanism_s))} ago"


# The fields of the mechanism's answers that hold a time on its clock, and those that hold a
# duration (the rest of ``_s`` fields are left as they are)
TIMES = frozenset({
    "arrival_s", "eta_s", "from_s", "started_s", "time_s", "last_solve_s", "solved_at_s", "degraded_since_s",
    "lost_at_s", "cancelled_at_s", "last_heartbeat_s", "at_s",
})
DURATIONS = frozenset({"waiting_s", "jct_s", "silent_s", "lost_s_ago", "degraded_s"})
DURATIONS_BY_TYPE = frozenset({"owed_s"})  # type -> a duration (`gavel job`'s why.owed_s)


def readable(value: object, clock: ClockView, key: str = "") -> object:
    """The answer with its times as dates and its durations as wall durations (recursively;
    ``eta_range_s`` as a range of dates; ``clock`` itself as one line)."""
    if isinstance(value, dict):
        out: dict[str, object] = {}
        for k, v in value.items():
            if k == "clock":
                out[k] = describe_clock(clock)
            elif k in DURATIONS_BY_TYPE and isinstance(v, dict):
                out[k] = {w: duration(clock.wall_duration(float(d))) if isinstance(d, (int, float)) else d for w, d in v.items()}
            else:
                out[k] = readable(v, clock, k)
        return out
    if isinstance(value, list):
        if key == "eta_range_s":
            return " to ".join(clock.date(v) if isinstance(v, (int, float)) else "unbounded" for v in value)
        return [readable(v, clock) for v in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if key in TIMES:
            text = clock.date(float(value))
            return f"{text} ({clock.until(float(value))})" if key == "eta_s" else text
        if key in DURATIONS:
            return duration(clock.wall_duration(float(value)))
    return value


def describe_clock(clock: ClockView) -> str:
    if clock.kind == "scaled":
        return f"scaled x{clock.scale:g} (times shown in wall time)"
    if clock.kind in ("lockstep", "virtual"):
        return f"{clock.kind} (times shown as the mechanism's, from its start)"
    return clock.kind or "unknown"
