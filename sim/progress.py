"""A run's progress on stderr: simulated hours and jobs done.

On a terminal, one line redrawn in place (``\\r``) at most every ``REDRAW_S``; anywhere else (a
pipe, a log file, a test) a plain line at most every ``LINE_EVERY_S``, so a short run prints
nothing and a long one leaves a sparse trail instead of thousands of carriage returns.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

REDRAW_S = 0.1
LINE_EVERY_S = 10.0
BAR_WIDTH = 24


class ProgressBar:
    """Call it as a simulator's progress callback ``(now_s, jobs_done, jobs_total)``; ``close()``
    once the run is over. ``clock`` is a monotonic wall clock in seconds (injected for tests)."""

    def __init__(
        self,
        label: str,
        stream: TextIO | None = None,
        *,
        interactive: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        simulated: bool = True,
    ) -> None:
        self._label = label
        self._simulated = simulated  # False: a plain count (submissions), no simulated hours
        self._stream = stream if stream is not None else sys.stderr
        self._interactive = _is_tty(self._stream) if interactive is None else interactive
        self._clock = clock
        self._started_s = clock()
        self._shown_s = self._started_s
        self._drawn = 0  # characters on the terminal line we own
        self._last: tuple[float, int, int] | None = None

    def __call__(self, now_s: float, jobs_done: int, jobs_total: int) -> None:
        self._last = (now_s, jobs_done, jobs_total)
        wall_s = self._clock()
        if self._interactive:
            if wall_s - self._shown_s >= REDRAW_S:
                self._shown_s = wall_s
                self._draw(self._text(now_s, jobs_done, jobs_total, wall_s))
        elif wall_s - self._shown_s >= LINE_EVERY_S:
            self._shown_s = wall_s
            self._stream.write(self._text(now_s, jobs_done, jobs_total, wall_s) + "\n")
            self._stream.flush()

    def close(self) -> None:
        """Leave the terminal line as the run ended (nothing to do elsewhere)."""
        if self._interactive and self._last is not None:
            self._draw(self._text(*self._last, self._clock()))
            self._stream.write("\n")
            self._stream.flush()

    def _text(self, now_s: float, jobs_done: int, jobs_total: int, wall_s: float) -> str:
        share = jobs_done / jobs_total if jobs_total else 1.0
        filled = round(share * BAR_WIDTH)
        bar = "#" * filled + "-" * (BAR_WIDTH - filled)
        simulated = f", {now_s / 3600:,.1f} h simulated" if self._simulated else ""
        return f"{self._label} [{bar}] {jobs_done}/{jobs_total} jobs{simulated}, {wall_s - self._started_s:.1f} s"

    def _draw(self, text: str) -> None:
        padding = " " * max(0, self._drawn - len(text))  # wipe what a longer line left behind
        self._stream.write("\r" + text + padding)
        self._stream.flush()
        self._drawn = len(text)


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or exotic stream: treat as not a terminal
        return False
