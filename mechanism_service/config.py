"""What a mechanism is started with: one frozen value instead of a constructor's twenty keyword
arguments (issue 24). The runtime it runs on (its clock, its journal, the bus) is given apart."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from common.throughputs import ThroughputTable
from mechanism_service.core import ownership
from mechanism_service.core.model import MechanismState
from mechanism_service.core.retention import KEEP_ALL, Forgotten, Retention
from mechanism_service.core.rounds import Shuffle
from mechanism_service.core.settings import MechanismSettings


@dataclass(frozen=True)
class MechanismConfig:
    settings: MechanismSettings
    policy: str
    # A table taken as the truth (rates looked up by job type), or, with ``estimates``, the
    # estimator's estimates with the table as their prior (core/rates.py).
    table: ThroughputTable
    # The agnostic type order's random stream, as it starts (a copy of it goes into the memory,
    # which a snapshot then carries: a config may start several incarnations).
    shuffle: Shuffle
    estimates: bool = False
    seed: int = 0
    solver: str | None = None
    allocation_timeout_s: float = 60.0
    # Stop before the next boundary when this holds (a simulation's end); the round already
    # dispatched still runs and is reported, not settled.
    stop_when: Callable[[MechanismState], bool] | None = None
    # Whether more jobs are known to be on their way (a trace replay knows; a live cluster does
    # not, and then an idle boundary re-solves at once).
    more_arrivals: Callable[[], bool] | None = None
    # The mechanism moves time itself (mechanism_service/clocks.py, LockstepClock): to a round's
    # end when every lease has reported, to the next arrival when idle.
    lockstep: bool = False
    expected_gpus: int | None = None  # lockstep: start when this many GPUs registered
    # A live round ends when its leases report, or this long after it began (a worker that never
    # reports must not stop the cluster); None (lockstep, virtual time): wait for all.
    round_timeout_s: float | None = None
    # Allocation requests carry a deadline (only wall time is shared with the policy service).
    deadlines: bool = True
    # A live cluster grows as workers join: a job waits for a type that can run it rather than
    # being refused because no such worker has joined yet.
    elastic_types: tuple[str, ...] = ()
    # Live: wait this long (wall time) after a submission wakes an idle loop, so a burst is
    # admitted by one boundary. Virtual and lockstep time need none (nothing races them).
    admission_batch_s: float = 0.0
    # Fault injection (sim/faults.py): called with the name of each point where a crash matters
    # to durability ("boundary.before_journal": the boundary's commands are not written yet;
    # "boundary.after_journal": written, none published); raising there is a crash of the round
    # loop, as a SIGKILL would be.
    crash_point: Callable[[str], None] | None = None
    # What is over is forgotten under this rule at each boundary (core/retention.py), and handed
    # to ``archive`` first when one is given.
    retention: Retention = KEEP_ALL
    archive: Callable[[Forgotten], None] | None = None
    owners: ownership.Ownership = ownership.Ownership()  # who owns a job, who may cancel it
    # Say the cluster's events (event.<kind>, the status query "events": core/events.py) for
    # people watching; the simulator has nobody watching, and they cost it ~10% of its time.
    events: bool = True

    @property
    def deadlines_on(self) -> bool:
        return self.deadlines and not self.lockstep
