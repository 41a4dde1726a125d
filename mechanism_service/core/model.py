"""The mechanism's state: admitted jobs, the entries that can be scheduled, their time ledgers.

An *entry* is what the mechanism schedules: a single job ``(j,)`` or, when the policy packs,
a pair ``(lo, hi)`` of jobs sharing the same GPUs. Jobs are numbered by admission order
(``JobState.index``); the string ids of the outside world live in ``JobState.job_id``.

Every dict here keeps insertion order on purpose: it is the order that breaks ties in the round
planner (docs/gavel-semantics.md sections 3 and 5): job 0, job 1, pair (0, 1), job 2, pairs
(0, 2), (1, 2), ... Deleting an entry keeps the relative order of the rest.

The ledgers are columns (``Ledgers``, core/ledgers.py: one row an entry, one column a type) so the planner's
passes over every entry and type are numpy operations; as a mapping they are entry ->
EntryLedger, as they always were.

The state is mutable and owned by one mechanism; only the reducers in ``reducers.py`` change it,
and the decisions (``priorities``, ``planning``, ``placement``) only read it.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# The ledgers live in ledgers.py; imported here by name, and re-exported, because snapshots
# written before that split pickled them (and the function that restores the ledgers) under
# this module's path: removing a name below breaks loading those snapshots.
from mechanism_service.core.ledgers import (  # noqa: F401
    Entry,
    EntryLedger,
    FrozenAllocation,
    Ledgers,
    _restore_ledgers,
    as_ledgers,
    share_matrix,
)


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
_FIELD_GETTERS = [operator.attrgetter(name) for name in JobState.__slots__]


class JobColumns:
    """Jobs in a snapshot: one tuple a field (JobState's, in order), one value a job."""

    __slots__ = ("columns",)

    def __init__(self, columns: Sequence[tuple[object, ...]]) -> None:
        self.columns = columns

    @classmethod
    def of(cls, jobs: Iterable[JobState]) -> JobColumns:
        jobs = list(jobs)  # a field at a time, in C (faster than transposing the jobs' tuples)
        return cls([tuple(map(getter, jobs)) for getter in _FIELD_GETTERS])

    def rows(self) -> list[JobState]:
        return [JobState(*values) for values in zip(*self.columns)]

    def __reduce__(self) -> tuple[type[JobColumns], tuple[Sequence[tuple[object, ...]]]]:
        return JobColumns, (self.columns,)


class JobTable(dict):  # type: ignore[type-arg]
    """The active jobs (index -> JobState, admission order) with their indices by job id kept
    beside them (``index_of``): an answer, keyed by job ids, is mapped to indices without a pass
    over every job (20,000 jobs: ~1.5-4 ms a solve). Only the reducers add and remove jobs, and
    only by ``table[index] = job`` and ``pop``; the other ways of changing a dict are refused."""

    __slots__ = ("index_of",)

    def __init__(self, jobs: Mapping[int, JobState] | Iterable[tuple[int, JobState]] = ()) -> None:
        super().__init__(jobs)
        self.index_of: dict[str, int] = {job.job_id: index for index, job in self.items()}

    def __setitem__(self, index: int, job: JobState) -> None:
        replaced = self.get(index)
        if replaced is not None:
            self._forget(index, replaced)
        dict.__setitem__(self, index, job)
        self.index_of[job.job_id] = index

    def __delitem__(self, index: int) -> None:
        self._forget(index, self[index])
        dict.__delitem__(self, index)

    def pop(self, index: int, *default: JobState) -> JobState:  # type: ignore[override]
        if index not in self and default:
            return default[0]
        job = self[index]  # KeyError as a dict's, when missing with no default
        del self[index]
        return job

    def _forget(self, index: int, job: JobState) -> None:
        if self.index_of.get(job.job_id) == index:
            del self.index_of[job.job_id]

    def _refuse(self, *args: object, **kwargs: object) -> None:
        raise TypeError("jobs are added and removed one at a time (table[index] = job, pop), to keep index_of true")

    update = setdefault = popitem = clear = __ior__ = _refuse  # type: ignore[assignment]

    def copy(self) -> JobTable:  # type: ignore[override]
        return JobTable(self)

    def __reduce__(self) -> tuple[type[JobTable], tuple[dict[int, JobState]]]:
        return JobTable, (dict(self),)


@dataclass(frozen=True, slots=True)
class Placement:
    accelerator_type: str
    worker_ids: tuple[int, ...]

    def __reduce__(self) -> tuple[type[Placement], tuple[str, tuple[int, ...]]]:
        # As JobState's: its values, not a frozen dataclass's state (5,225 leases pickle ~2.5x faster)
        return Placement, (self.accelerator_type, self.worker_ids)


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
    jobs: JobTable = field(default_factory=JobTable)  # active jobs, admission order (a dict given here becomes one)
    # entry -> ledger, admission order (a dict given here becomes Ledgers over the types of gpus)
    entries: Ledgers = field(default_factory=dict)  # type: ignore[assignment]
    type_time_s: dict[str, float] = field(default_factory=dict)  # time handed out per type
    allocation: dict[Entry, dict[str, float]] = field(default_factory=dict)  # a FrozenAllocation once solved
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
    # The seams (core/seams/), kept only when a non-default choice runs: each job's last lease
    # (a placement strategy's "where it ran last"), and when a job left the admission queue.
    last_placements: dict[int, Placement] = field(default_factory=dict)
    admitted_at_s: dict[int, float] = field(default_factory=dict)
    # Job index -> when its latest uninterrupted run began (its last run's length, for Tiresias'
    # starvation guard: policy_input). Here, not in JobState, whose slotted pickles in older
    # snapshots could not take a new field.
    run_started_s: dict[int, float] = field(default_factory=dict)
    # When the allocation in force may change though no job arrives or leaves (the policy's
    # ``valid_for_s``: a job crossing a priority threshold); None: never (most policies)
    resolve_at_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.jobs, JobTable):
            self.jobs = JobTable(self.jobs)
        if not isinstance(self.entries, Ledgers):
            self.entries = as_ledgers(self.gpus, self.entries)

    def __getstate__(self) -> tuple[None, dict[str, object]]:
        # pickle's default form of a slotted object, (None, {slot: value}), but the jobs (active
        # and completed) as columns: a list per field instead of an object per job, 2.4x
        # cheaper to write (20,000 jobs: 57 -> 23 ms), the same bytes.
        slots = {name: getattr(self, name) for name in self.__slots__ if hasattr(self, name)}
        slots["jobs"] = JobColumns.of(self.jobs.values())
        slots["completed"] = JobColumns.of(self.completed)
        return None, slots

    def __setstate__(self, state: tuple[object, dict[str, object]]) -> None:
        # A snapshot written before took the default form (jobs as objects, the ledgers a dict of
        # EntryLedger): both load.
        for name, value in state[1].items():
            object.__setattr__(self, name, value)
        if isinstance(self.jobs, JobColumns):
            self.jobs = JobTable({job.index: job for job in self.jobs.rows()})
        elif not isinstance(self.jobs, JobTable):  # a snapshot of before the table: a dict
            self.jobs = JobTable(self.jobs)
        if isinstance(self.completed, JobColumns):
            self.completed = self.completed.rows()
        if not isinstance(self.entries, Ledgers):
            self.entries = as_ledgers(self.gpus, self.entries)

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
