"""The mechanism's state: admitted jobs, the entries that can be scheduled, their time ledgers.

An *entry* is what the mechanism schedules: a single job ``(j,)`` or, when the policy packs,
a pair ``(lo, hi)`` of jobs sharing the same GPUs. Jobs are numbered by admission order
(``JobState.index``); the string ids of the outside world live in ``JobState.job_id``.

Every dict here keeps insertion order on purpose: it is the order that breaks ties in the round
planner (docs/gavel-semantics.md sections 3 and 5): job 0, job 1, pair (0, 1), job 2, pairs
(0, 2), (1, 2), ... Deleting an entry keeps the relative order of the rest.

The ledgers are columns (``Ledgers``: one row an entry, one column a type) so the planner's
passes over every entry and type are numpy operations; as a mapping they are entry ->
EntryLedger, as they always were.

The state is mutable and owned by one mechanism; only the reducers in ``reducers.py`` change it,
and the decisions (``priorities``, ``planning``, ``placement``) only read it.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Collection, Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field

import numpy as np

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


@dataclass(slots=True)
class EntryLedger:
    """Per accelerator type: steps/s of each member, time received since the last reset (plus
    the seed), and the accumulated deficit (allocation x elapsed - time received)."""

    throughputs: dict[str, tuple[float, ...]]  # type -> one value per member
    received_s: dict[str, float]
    deficit_s: dict[str, float]

    def __reduce__(self) -> tuple[type[EntryLedger], tuple[object, ...]]:
        return EntryLedger, (self.throughputs, self.received_s, self.deficit_s)  # as JobState's


class FrozenAllocation(dict):  # type: ignore[type-arg]
    """The installed allocation (entry -> type -> fraction), replaced whole at every solve and
    never changed in place: so the ledgers' columnar copy of it (``Ledgers.allocation_matrix``)
    stays true for as long as this object is the state's allocation."""

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> None:
        raise TypeError("the installed allocation is replaced whole (reducers.apply_allocation), never changed in place")

    __setitem__ = __delitem__ = __ior__ = _refuse  # type: ignore[assignment]
    update = setdefault = pop = popitem = clear = _refuse  # type: ignore[assignment]

    def __reduce__(self) -> tuple[type[FrozenAllocation], tuple[dict[Entry, dict[str, float]]]]:
        return FrozenAllocation, (dict(self),)


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


class _TypeColumns(Mapping[str, float]):
    """One entry's row of one ledger array, by type: reads give floats, writes go to the array."""

    __slots__ = ("_ledgers", "_entry", "_name")

    def __init__(self, ledgers: Ledgers, entry: Entry, name: str) -> None:
        self._ledgers, self._entry, self._name = ledgers, entry, name

    def _cells(self) -> tuple[np.ndarray, int]:
        ledgers = self._ledgers
        return getattr(ledgers, self._name), ledgers.row_of[self._entry]

    def __getitem__(self, w: str) -> float:
        array, row = self._cells()
        return float(array[row, self._ledgers.column_of[w]])

    def __setitem__(self, w: str, value: float) -> None:
        array, row = self._cells()
        array[row, self._ledgers.column_of[w]] = value

    def update(self, values: Mapping[str, float]) -> None:
        for w, value in values.items():
            self[w] = value

    def __iter__(self) -> Iterator[str]:
        return iter(self._ledgers.types)

    def __len__(self) -> int:
        return len(self._ledgers.types)

    def __repr__(self) -> str:
        return repr(dict(self))

    def __reduce__(self) -> tuple[type[dict], tuple[dict[str, float]]]:  # type: ignore[type-arg]
        return dict, (dict(self),)  # a copy is a plain dict


class _Throughputs(_TypeColumns):
    """One entry's steps/s per type, a value per member (the second member's column of a single
    repeats its first, so the minimum over members is one array operation)."""

    __slots__ = ()

    def __init__(self, ledgers: Ledgers, entry: Entry) -> None:
        super().__init__(ledgers, entry, "throughputs")

    def __getitem__(self, w: str) -> tuple[float, ...]:  # type: ignore[override]
        ledgers = self._ledgers
        cell = ledgers.throughputs[ledgers.row_of[self._entry], ledgers.column_of[w]]
        return (float(cell[0]),) if len(self._entry) == 1 else (float(cell[0]), float(cell[1]))

    def __setitem__(self, w: str, value: tuple[float, ...]) -> None:  # type: ignore[override]
        ledgers = self._ledgers
        ledgers.throughputs[ledgers.row_of[self._entry], ledgers.column_of[w]] = (value[0], value[-1])


class Ledgers(MutableMapping[Entry, EntryLedger]):
    """Every entry's time ledger as columns: one row an entry (in admission order: the planner's
    tie-break), one column an accelerator type. The planner's passes (reset, priorities, moves'
    charges, the pick's sort) are numpy operations over these arrays instead of a walk over
    entries x types at ~1 us a cell in Python.

    As a mapping it is what the state's ``entries`` always was (entry -> EntryLedger, in
    admission order); the EntryLedger it hands out reads and writes the arrays (it finds its row
    by its entry at every access). A removed entry leaves a hole (``keys[row] is None``,
    ``live[row]`` False): removing a job costs its own entries, not a shift of every row; the
    holes are closed (``compact``) when they are half the rows. Rows are only meaningful within
    one pass: any removal may move them.

    ``allocation`` (rows x types) is the installed allocation's columnar copy, made by
    ``allocation_matrix`` and kept while the state holds the same FrozenAllocation.
    """

    __slots__ = (
        "types", "column_of", "keys", "row_of", "rows", "throughputs", "received_s", "deficit_s", "allocation", "live",
        "members",
        "allocation_of", "_holes", "_by_job",
    )

    def __init__(self, types: Iterable[str] = ()) -> None:
        self.types: list[str] = list(types)
        self.column_of = {w: k for k, w in enumerate(self.types)}
        self.keys: list[Entry | None] = []  # row -> entry (None: removed)
        self.row_of: dict[Entry, int] = {}  # entry -> row, in admission order
        self.rows = 0
        self._holes = 0
        self._by_job: dict[int, dict[Entry, None]] = {}  # job index -> its entries (an ordered set)
        self.allocation_of: object = None
        self._allocate_arrays(16)

    def _allocate_arrays(self, capacity: int) -> None:
        t = len(self.types)
        self.throughputs = np.zeros((capacity, t, 2))
        self.received_s = np.zeros((capacity, t))
        self.deficit_s = np.zeros((capacity, t))
        self.allocation = np.zeros((capacity, t))
        self.live = np.zeros(capacity, dtype=bool)
        # each row's member job indices (a single's twice; -1 for a removed row): the planner's
        # sums per job (core/catch_up.py) in numpy, not a walk over the entries
        self.members = np.full((capacity, 2), -1, dtype=np.int64)

    def _grow(self) -> None:
        old = (self.throughputs, self.received_s, self.deficit_s, self.allocation, self.live, self.members)
        self._allocate_arrays(2 * len(self.live))
        for new, before in zip((self.throughputs, self.received_s, self.deficit_s, self.allocation, self.live, self.members), old):
            new[: self.rows] = before[: self.rows]

    # -- the mapping ---------------------------------------------------------------------------

    def __getitem__(self, entry: Entry) -> EntryLedger:
        if entry not in self.row_of:
            raise KeyError(entry)
        return EntryLedger(_Throughputs(self, entry), _TypeColumns(self, entry, "received_s"), _TypeColumns(self, entry, "deficit_s"))

    def __setitem__(self, entry: Entry, ledger: EntryLedger) -> None:
        """A new entry takes the next row (an existing one has its values overwritten)."""
        row = self.row_of.get(entry)
        if row is None:
            if self.rows == len(self.live):
                self._grow()
            row = self.rows
            self.rows += 1
            self.keys.append(entry)
            self.row_of[entry] = row
            self.live[row] = True
            self.members[row] = (entry[0], entry[-1])
            self.allocation[row] = 0.0  # not in the installed allocation (it came after)
            for i in entry:
                self._by_job.setdefault(i, {})[entry] = None
        types = self.types  # a row at a time (an admission adds one a job and pair)
        throughputs = [ledger.throughputs[w] for w in types]
        self.throughputs[row] = [(rates[0], rates[-1]) for rates in throughputs]  # types x 2
        self.received_s[row] = [ledger.received_s[w] for w in types]
        self.deficit_s[row] = [ledger.deficit_s[w] for w in types]

    def __delitem__(self, entry: Entry) -> None:
        row = self.row_of.pop(entry)
        self.keys[row] = None
        self.live[row] = False
        self.members[row] = -1
        self._holes += 1
        for i in entry:
            others = self._by_job.get(i)
            if others is not None:
                others.pop(entry, None)
                if not others:
                    del self._by_job[i]
        if self._holes * 2 > self.rows and self.rows > 64:
            self.compact()

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.row_of)

    def __len__(self) -> int:
        return len(self.row_of)

    def __contains__(self, entry: object) -> bool:
        return entry in self.row_of

    def entries_of(self, index: int) -> list[Entry]:
        """The job's entries (its single and every pair it is in), in admission order."""
        return list(self._by_job.get(index, ()))

    # -- columns -------------------------------------------------------------------------------

    def add_type(self, w: str, received_s: float) -> None:
        """A new accelerator type: a column, each entry seeded with ``received_s``, no deficit,
        no throughput (the caller sets each entry's) and no allocation."""
        self.types.append(w)
        self.column_of[w] = len(self.types) - 1
        pad = [(0, 0), (0, 1)]
        self.throughputs = np.pad(self.throughputs, [*pad, (0, 0)])
        self.received_s = np.pad(self.received_s, pad, constant_values=received_s)
        self.deficit_s = np.pad(self.deficit_s, pad)
        self.allocation = np.pad(self.allocation, pad)

    def compact(self) -> None:
        """Close the holes removed entries left (the order of the rest is kept)."""
        if not self._holes:
            return
        kept = np.flatnonzero(self.live[: self.rows])
        self.keys = [self.keys[r] for r in kept.tolist()]
        self.row_of = {entry: row for row, entry in enumerate(self.keys)}  # type: ignore[misc]
        n = len(kept)
        for name in ("throughputs", "received_s", "deficit_s", "allocation", "live", "members"):
            array = getattr(self, name)
            array[:n] = array[kept]
            array[n:] = 0
        self.members[n:] = -1
        self.rows, self._holes = n, 0

    def allocation_matrix(self, allocation: Mapping[Entry, Mapping[str, float]]) -> np.ndarray:
        """``allocation`` as rows x types (0.0 where it gives an entry nothing), kept while it is
        the same FrozenAllocation (it cannot change in place)."""
        view = self.allocation[: self.rows]
        if allocation is self.allocation_of:
            return view
        view[:] = 0.0
        row_of, column_of = self.row_of, self.column_of
        for entry, shares in allocation.items():
            row = row_of.get(entry)
            if row is None:
                continue
            for w, share in shares.items():
                k = column_of.get(w)
                if k is not None:
                    view[row, k] = share
        self.allocation_of = allocation if isinstance(allocation, FrozenAllocation) else None
        return view

    def set_allocation(self, allocation: FrozenAllocation, rows: Sequence[int], shares: np.ndarray) -> None:
        """Install ``allocation``'s columnar copy: ``shares[i]`` (one value a type) for row
        ``rows[i]``, nothing for every other row."""
        view = self.allocation[: self.rows]
        view[:] = 0.0
        if len(rows):
            view[np.asarray(rows)] = shares
        self.allocation_of = allocation

    # -- pickling: the columns of the live rows ------------------------------------------------

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # The snapshot's form: the live rows; a pair's second member's throughputs only (a
        # single's repeat its first); no allocation matrix (gathered again at its first use).
        kept = np.flatnonzero(self.live[: self.rows])
        keys = [self.keys[r] for r in kept.tolist()]
        pairs = kept[np.fromiter(map(len, keys), int, len(keys)) == 2]
        return _restore_ledgers, (
            self.types, keys, self.throughputs[kept, :, 0], self.throughputs[pairs, :, 1],
            self.received_s[kept], self.deficit_s[kept],
        )

    def __deepcopy__(self, memo: dict[int, object]) -> Ledgers:
        # A copy in memory keeps the allocation matrix, tied to the copy of the allocation it
        # mirrors (the memo makes it the copied state's own).
        copied = _restore_ledgers(*self.__reduce__()[1])  # type: ignore[arg-type]
        kept = np.flatnonzero(self.live[: self.rows])
        copied.allocation[: len(kept)] = self.allocation[kept]
        copied.allocation_of = copy.deepcopy(self.allocation_of, memo)
        return copied

    def __eq__(self, other: object) -> bool:
        return Mapping.__eq__(self, other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Ledgers({dict(self.items())!r})"


def _restore_ledgers(
    types: list[str], keys: list[Entry], first: np.ndarray, second_of_pairs: np.ndarray, received_s: np.ndarray,
    deficit_s: np.ndarray,
) -> Ledgers:
    ledgers = Ledgers(types)
    n = len(keys)
    ledgers._allocate_arrays(max(16, n))
    ledgers.throughputs[:n, :, 0] = ledgers.throughputs[:n, :, 1] = first
    ledgers.throughputs[np.flatnonzero(np.fromiter(map(len, keys), int, n) == 2), :, 1] = second_of_pairs
    ledgers.received_s[:n], ledgers.deficit_s[:n] = received_s, deficit_s
    ledgers.live[:n] = True
    if n:
        ledgers.members[:n] = [(entry[0], entry[-1]) for entry in keys]
    ledgers.keys = list(keys)
    ledgers.row_of = {entry: row for row, entry in enumerate(keys)}
    ledgers.rows = n
    for entry in keys:
        for i in entry:
            ledgers._by_job.setdefault(i, {})[entry] = None
    return ledgers


def as_ledgers(types: Iterable[str], entries: Mapping[Entry, EntryLedger]) -> Ledgers:
    """Ledgers holding ``entries`` (a snapshot written when they were a dict of EntryLedger)."""
    ledgers = Ledgers(types)
    for entry, ledger in entries.items():
        ledgers[entry] = ledger
    return ledgers


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


def share_matrix(shares_of: Collection[Mapping[str, float]], types: Sequence[str]) -> np.ndarray:
    """Rows of fractions (type -> share) as rows x types, 0.0 where a row names no share: in C,
    a type at a time (a look-up that cannot miss while every row names the type, as a solver's
    answer does). The same floats as a row-by-row copy."""
    count = len(shares_of)
    shares = np.empty((count, len(types)))
    for k, w in enumerate(types):
        try:
            shares[:, k] = np.fromiter(map(operator.itemgetter(w), shares_of), float, count)
        except KeyError:  # a row without the type
            shares[:, k] = np.fromiter(map(operator.methodcaller("get", w, 0.0), shares_of), float, count)
    return shares
