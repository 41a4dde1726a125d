"""What the bus-free path carries from one round boundary to the next: the whole of a run's
state, and when to hand it out (``gavel simulate --checkpoint-to``; sim/checkpoint.py writes it to
a file and reads it back, sim/fastpath.py takes it up where it stopped).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class Carry:
    """The bus-free loop's variables at the top of an iteration, by their names in
    sim/fastpath.py's ``simulate``: everything the rest of the run reads (the table, the settings
    and the measured jobs come again from the trace and the config)."""

    state: object  # MechanismState
    arrivals: object  # deque of the TraceJobs still to arrive
    waiting_for: set[str]
    shuffle: object
    chosen: object  # the seams' plug-ins
    queued: list
    learning: object  # InLoopEstimator | None
    rates: object
    now_s: float
    clock: object  # RoundClock
    running: list
    full_leases: dict
    rounds: list
    solve_times: list[float]
    rejected: list[str]
    idle_passes: int
    solve_failed: str

    def values(self) -> tuple:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))


@dataclass(slots=True)
class CheckpointPlan:
    """When to hand the run's state to ``save``, once: at the first boundary at or after
    ``at_s`` of simulated time, or once ``after_jobs`` jobs have arrived (Gavel's
    --checkpoint_threshold: when that job id comes in). The run then goes on to its end."""

    save: Callable[[Carry], None]
    at_s: float = math.inf
    after_jobs: int | None = None
    done: bool = False

    def due(self, now_s: float, arrived: int) -> bool:
        if self.done:
            return False
        return now_s >= self.at_s or (self.after_jobs is not None and arrived >= self.after_jobs)
