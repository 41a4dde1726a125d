"""The time ledgers of every entry, as columns (one row an entry, one column an accelerator type),
and the installed allocation that they mirror. Split from model.py (issue 24): the jobs and the
state live there, the arrays the planner's passes run over here.

An *entry* is what the mechanism schedules: a single job ``(j,)`` or, when the policy packs, a
pair ``(lo, hi)`` of jobs sharing the same GPUs. Rows keep admission order on purpose: it is
the order that breaks ties in the round planner (docs/gavel-semantics.md sections 3 and 5).

Snapshots written before the split pickled these classes (and ``_restore_ledgers``) under
mechanism_service.core.model, which re-exports them so that those snapshots still load.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Collection, Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass

import numpy as np

Entry = tuple[int, ...]  # (j,) or (lo, hi), job indices in admission order, lo < hi


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
        self._ledgers.changed()

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
        ledgers.changed()


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

    ``derived``: what the planner reads from the ledgers but a lease's time (its lists of the
    allocation, the deficits and the rates, each type's candidates), kept between rounds, which
    change only the time received: every other write (an entry added or removed, a column
    written, an allocation installed, the reset's fold: ``changed``) empties it, so it is made
    again from the ledgers as they are at its next read.
    """

    __slots__ = (
        "types", "column_of", "keys", "row_of", "rows", "throughputs", "received_s", "deficit_s", "allocation", "live",
        "members",
        "_allocation_of", "_holes", "_by_job", "derived",
    )

    def __init__(self, types: Iterable[str] = ()) -> None:
        self.types: list[str] = list(types)
        self.column_of = {w: k for k, w in enumerate(self.types)}
        self.keys: list[Entry | None] = []  # row -> entry (None: removed)
        self.row_of: dict[Entry, int] = {}  # entry -> row, in admission order
        self.rows = 0
        self._holes = 0
        self._by_job: dict[int, dict[Entry, None]] = {}  # job index -> its entries (an ordered set)
        self._allocation_of: object = None
        self.derived: dict[str, object] = {}
        self._allocate_arrays(16)

    def changed(self) -> None:
        """The ledgers changed other than by a lease's time received (settle_round adds that to
        ``received_s`` without calling this): what was derived from them is made again."""
        if self.derived:
            self.derived = {}

    @property
    def allocation_of(self) -> object:
        """The FrozenAllocation that ``allocation`` mirrors (None: none, gathered at next use)."""
        return self._allocation_of

    @allocation_of.setter
    def allocation_of(self, allocation: object) -> None:
        self._allocation_of = allocation
        self.changed()

    def _allocate_arrays(self, capacity: int) -> None:
        self.changed()
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
        self.changed()
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
        self.changed()
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
        self.changed()
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
        self.changed()
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
