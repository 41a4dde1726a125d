"""Everything the mechanism must remember across a restart (the journal's snapshot), and how a
snapshot written by an earlier version is brought up to date. Pure.

``Memory`` and ``Lease`` were defined in mechanism_service/service.py until issue 24; snapshots
written then pickle them under that path, which service.py keeps importable on purpose.
"""

from __future__ import annotations

import collections
import dataclasses

from common.messages import JobProgress, ThroughputEstimated
from common.throughputs import ThroughputTable
from mechanism_service.core import ownership
from mechanism_service.core import status as status_core
from mechanism_service.core.admission import NewJob
from mechanism_service.core.estimates import EstimateBook
from mechanism_service.core.intake import Intake
from mechanism_service.core.model import Entry, MechanismState, Placement
from mechanism_service.core.rates import EstimatedRates, Rates, TableRates
from mechanism_service.core.rounds import RoundClock, RoundPlan, RoundReport, Shuffle


@dataclasses.dataclass(frozen=True, slots=True)
class Lease:
    lease_id: str
    entry: Entry
    placement: Placement
    dispatched_at_s: float


@dataclasses.dataclass
class Memory:
    """Everything the mechanism must remember across a restart (the journal's snapshot)."""

    state: MechanismState | None = None
    servers: dict[str, list[tuple[str, int]]] = dataclasses.field(default_factory=lambda: collections.defaultdict(list))
    submitted: list[NewJob] = dataclasses.field(default_factory=list)  # accepted, not yet admitted
    # arrived, but the cluster as it is cannot run them (a live cluster may grow): with why
    held: list[tuple[NewJob, str]] = dataclasses.field(default_factory=list)
    # feasible, but the admission policy (core/seams/admission.py) has not admitted them yet: with why
    queued: list[tuple[NewJob, str]] = dataclasses.field(default_factory=list)
    intake: Intake = dataclasses.field(default_factory=Intake)  # every id accepted, the batches
    cancelling: dict[str, str] = dataclasses.field(default_factory=dict)  # active job id -> why: leaves at the next boundary
    refused_workers: dict[str, str] = dataclasses.field(default_factory=dict)  # worker id -> why
    policy: str = ""  # the policy and preset this memory was made under: a restart under
    preset: str = ""  # others is said in the log
    expected: dict[str, Lease] = dataclasses.field(default_factory=dict)  # leases of the running round
    reports: dict[str, list[JobProgress]] = dataclasses.field(default_factory=dict)
    round_clock: RoundClock = dataclasses.field(default_factory=RoundClock)
    round_id: int = 0
    running: tuple[float, RoundPlan, bool] | None = None  # (start, plan, reset) of the running round
    round_reports: list[RoundReport] = dataclasses.field(default_factory=list)
    solve_times_s: list[float] = dataclasses.field(default_factory=list)
    last_boundary_s: float = 0.0
    now_s: float = 0.0  # lockstep time
    shuffle: Shuffle | None = None
    commands: list[bytes] = dataclasses.field(default_factory=list)  # the last boundary's, encoded
    worker_of: dict[int, tuple[str, int]] = dataclasses.field(default_factory=dict)  # GPU id -> (worker, index)
    # The estimator's latest word (estimated rates only): applied at the next boundary, in the
    # order it came, so the schedule does not depend on when a message lands within a round.
    book: EstimateBook = dataclasses.field(default_factory=EstimateBook)
    pending_estimates: list[ThroughputEstimated] = dataclasses.field(default_factory=list)
    user_estimates: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)  # job -> its submitter's estimate
    ended_jobs: set[str] = dataclasses.field(default_factory=set)  # left the cluster: late estimates are dropped
    observations: status_core.Observations = dataclasses.field(default_factory=status_core.Observations)
    allocations: dict[str, bytes] = dataclasses.field(default_factory=dict)  # replies replayed from the journal
    epoch: int = 0  # this mechanism's incarnation: one more at every start; every command carries it
    # job id -> (command, working directory) for the jobs that gave either (JobSpec); here, not in
    # NewJob or JobState, whose slotted pickles in older snapshots could not take a new field
    launch: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    # watched workers (they sent a heartbeat) -> when they were last heard, mechanism time
    last_heard_s: dict[str, float] = dataclasses.field(default_factory=dict)
    lost_workers: dict[str, dict[str, object]] = dataclasses.field(default_factory=dict)  # id -> type, gpus, lost_at_s, reason
    # joined worker id -> the process that holds it (WorkerRegistered.instance; core/membership.py)
    instances: dict[str, str] = dataclasses.field(default_factory=dict)
    owners: dict[str, ownership.Owner] = dataclasses.field(default_factory=dict)  # job id -> who submitted it
    ended_leases: dict[str, str] = dataclasses.field(default_factory=dict)  # running round's leases ended early -> why
    resolve_now: bool = False  # a worker was lost: solve again at the next boundary, whatever the interval
    # Retention (core/retention.py): every finished job id -> when it ended, in that order (what
    # is forgotten first), and how many round reports and solve times were forgotten already
    ended_at_s: dict[str, float] = dataclasses.field(default_factory=dict)
    rounds_forgotten: int = 0
    solves_forgotten: int = 0


def upgraded(memory: Memory) -> Memory:
    """A snapshot written by an earlier version: the fields it lacks get their defaults (pickle
    restores the attributes an object had when it was written, and no others)."""
    for holder, cls in ((memory, Memory), (memory.observations, status_core.Observations)):
        for f in dataclasses.fields(cls):
            if f.name not in vars(holder):
                default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default  # type: ignore[misc]
                setattr(holder, f.name, default)
    vars(memory).pop("estimates", None)  # provenance only, before the estimate book
    if memory.state is not None:
        present = _slots_set(memory.state)
        for f in dataclasses.fields(MechanismState):
            if f.name in present:
                continue
            if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                setattr(memory.state, f.name, f.default_factory())  # type: ignore[misc]
            elif f.default is not dataclasses.MISSING:
                setattr(memory.state, f.name, f.default)
    legacy_known = vars(memory).pop("known_jobs", None)  # a set of ids, before specs were kept
    if legacy_known:
        memory.intake.known.update(dict.fromkeys(legacy_known))
    vars(memory).pop("sealed", None)
    if not memory.ended_at_s and memory.state is not None:  # written before retention: its ended jobs
        obs = memory.observations  # are forgotten under the rule as if they ended when the mechanism began
        memory.ended_at_s = dict.fromkeys([*(j.job_id for j in memory.state.completed), *obs.cancelled, *obs.rejected], 0.0)
    return memory


def resume_under(memory: Memory, policy: str, preset: str) -> tuple[str, str] | None:
    """A memory made under another policy (or preset) resumes under this one: the policy and
    preset it was made under (None: the same, or a new memory), its allocation to be solved
    afresh (it and a stateful policy's continuation are the old policy's). The memory is made
    this policy's either way."""
    before = (memory.policy, memory.preset)
    changed = bool(memory.policy) and before != (policy, preset)
    if changed and memory.state is not None:
        memory.state.needs_allocation = True
        memory.state.policy_state = ""
    memory.policy, memory.preset = policy, preset
    return before if changed else None


def _slots_set(state: MechanismState) -> set[str]:
    """The slots of a (slotted) state object that hold a value."""
    return {name for name in type(state).__slots__ if hasattr(state, name)}


class MemoryCell:
    """The memory every collaborator of the mechanism reads and writes, and the rates bound to it.
    One cell, shared: a recovery replaces the memory whole (``adopt``), and the collaborators,
    which hold the cell, see the new one."""

    def __init__(self, memory: Memory, table: ThroughputTable, *, estimates: bool) -> None:
        # A table taken as the truth (rates looked up by job type), or the estimator's estimates
        # with the table as their prior (core/rates.py).
        self._table = table
        self.estimates = estimates
        self.memory = memory
        self.rates: Rates = self._rates()

    def adopt(self, memory: Memory) -> None:
        self.memory = memory
        self.rates = self._rates()

    def _rates(self) -> Rates:
        """Bound to the memory's book and users' estimates."""
        if self.estimates:
            return EstimatedRates(self.memory.book, self._table, self.memory.user_estimates)
        return TableRates.of(self._table)
