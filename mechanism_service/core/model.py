"""The mechanism's state: admitted jobs, the entries that can be scheduled, their time ledgers.

An *entry* is what the mechanism schedules: a single job ``(j,)`` or, when the policy packs,
a pair ``(lo, hi)`` of jobs sharing the same GPUs. Jobs are numbered by admission order
(``JobState.index``); the string ids of the outside world live in ``JobState.job_id``.

Every dict here keeps insertion order on purpose: it is the order that breaks ties in the round
planner (docs/gavel-semantics.md sections 3 and 5): job 0, job 1, pair (0, 1), job 2, pairs
(0, 2), (1, 2), ... Deleting an entry keeps the relative order of the rest.

The state is mutable and owned by one mechanism; only the reducers in ``reducers.py`` change it,
and the decisions (``priorities``, ``planning``, ``placement``) only read it.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

Entry = tuple[int, ...]  # (j,) or (lo, hi), job indices in admission order, lo < hi


@dataclass(slots=True)
class JobState:
    index: int
    job_id: str
    job_type: str
    scale_factor: int
    priority_weight: float
    total_steps: int
    arrival_s: float
    slo_s: float | None = None
    entity: str | None = None
    steps_done: int = 0
    failures: int = 0  # consecutive rounds in which a gang got fewer steps than GPUs
    first_run_s: float | None = None
    last_finish_s: float | None = None  # finish time of the last lease it ran in
    gpu_seconds_by_type: dict[str, float] = field(default_factory=dict)
    # finish-time fairness bookkeeping (see reducers.apply_allocation)
    isolated_time_s: float = 0.0
    steps_remaining_at_last_solve: int | None = None
    isolated_throughput_at_last_solve: float | None = None

    @property
    def steps_remaining(self) -> int:
        return self.total_steps - self.steps_done

    def __reduce__(self) -> tuple[type[JobState], tuple[object, ...]]:
        # Pickled (the journal's snapshot) as its values in field order, gathered in C: a quarter
        # fewer bytes than the default form, which names every slot. Snapshots written in the
        # default form still load.
        return JobState, _JOB_FIELDS(self)


_JOB_FIELDS = operator.attrgetter(*JobState.__slots__)


@dataclass(slots=True)
class EntryLedger:
    """Per accelerator type: steps/s of each member, time received since the last reset (plus
    the seed), and the accumulated deficit (allocation x elapsed - time received)."""

    throughputs: dict[str, tuple[float, ...]]  # type -> one value per member
    received_s: dict[str, float]
    deficit_s: dict[str, float]

    def __reduce__(self) -> tuple[type[EntryLedger], tuple[object, ...]]:
        return EntryLedger, (self.throughputs, self.received_s, self.deficit_s)  # as JobState's


@dataclass(frozen=True, slots=True)
class Placement:
    accelerator_type: str
    worker_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Worker:
    worker_id: int
    accelerator_type: str
    server: int  # index of its server within its type


@dataclass
class ProfilingState:
    """The profiling budget and what it was spent on (core/profiling.py)."""

    tokens_gpus: float = 0.0  # GPU-rounds the budget has left
    served: dict[str, set[tuple[str, str]]] = field(default_factory=dict)  # job -> (type, partner class) run
    packed_served: dict[str, int] = field(default_factory=dict)  # job -> packed runs since its latest request
    leases: int = 0  # profiling leases run so far
    gpu_rounds: float = 0.0  # GPU-rounds they took


@dataclass(slots=True)
class MechanismState:
    gpus: dict[str, int]  # accelerator type -> GPUs, in registration order
    servers: dict[str, list[list[int]]]  # type -> servers -> worker ids (ascending)
    jobs: dict[int, JobState] = field(default_factory=dict)  # active jobs, admission order
    entries: dict[Entry, EntryLedger] = field(default_factory=dict)
    type_time_s: dict[str, float] = field(default_factory=dict)  # time handed out per type
    allocation: dict[Entry, dict[str, float]] = field(default_factory=dict)
    last_reset_s: float = 0.0
    needs_allocation: bool = True
    previous_assignment: dict[Entry, Placement] = field(default_factory=dict)
    round_start_s: float = 0.0  # start of the round whose leases are being settled
    next_index: int = 0
    next_worker_id: int = 0
    completed: list[JobState] = field(default_factory=list)  # in completion order
    resets: int = 0
    policy_state: str = ""  # the policy's opaque continuation, sent back with the next request
    leases_extended: int = 0
    lease_opportunities: int = 0
    profiling: ProfilingState = field(default_factory=ProfilingState)
    # Migration (core/migration.py): rounds each entry of last round has run on its GPUs without
    # a move, and what a move cost each job type as real workers measured it (start-up and
    # restore, seconds summed, and how many moves).
    stretch_rounds: dict[Entry, int] = field(default_factory=dict)
    move_costs_by_job_type: dict[str, tuple[float, int]] = field(default_factory=dict)

    @property
    def accelerator_types(self) -> tuple[str, ...]:
        return tuple(self.gpus)

    def job_ids_of(self, entry: Entry) -> tuple[str, ...]:
        return tuple(self.jobs[j].job_id for j in entry)


def new_state(gpus_by_type: dict[str, int], gpus_per_server: int = 1) -> MechanismState:
    """Workers numbered as Gavel registers them: types in sorted name order, each type's
    servers in turn, consecutive ids (k80 0-3, p100 4-7, v100 8-11 for a 4:4:4 cluster)."""
    gpus: dict[str, int] = {}
    servers: dict[str, list[list[int]]] = {}
    next_id = 0
    for accelerator_type in sorted(gpus_by_type):
        count = gpus_by_type[accelerator_type]
        if count % gpus_per_server:
            raise ValueError(f"{accelerator_type}: {count} GPUs do not fill servers of {gpus_per_server}")
        servers[accelerator_type] = []
        for _ in range(count // gpus_per_server):
            servers[accelerator_type].append(list(range(next_id, next_id + gpus_per_server)))
            next_id += gpus_per_server
        gpus[accelerator_type] = count
    return MechanismState(gpus=gpus, servers=servers, type_time_s=dict.fromkeys(gpus, 0.0), next_worker_id=next_id)
