"""One round's decisions, as pure functions of the state (docs/gavel-semantics.md sections 5-6):

1. ``priorities``: per type, each entry's allocation / share of the type's time it received;
2. ``pick``: a greedy pass over the per-type queues, fastest type first, gangs whole;
3. ``place``: concrete workers per picked entry, keeping a continuing entry on its GPUs.

The rounds run the columnar forms (``held_columns``, ``fit_held_columns``, ``priority_columns``,
``charge_move_columns``, ``pick_columns``): the same arithmetic as the row forms, one numpy operation a type over the
ledgers' columns (model.Ledgers) instead of a walk over every entry and type, then one greedy
pass over each type's sorted candidates. The row forms (migration.held_entries, migration.fit_held,
``priority_rows``, migration.charge_moves, ``pick``) are their definitions:
tests/unit/mechanism/test_planning_fast.py and test_boundary_fast.py hold each columnar form to
them, exactly. For a few rows (SMALL_ROWS) a round reads the columns once as lists
(``ledger_lists``) and the holds, their fit and the queues (``queue_lists``: priorities and
moves' charges fused) run on Python floats: test_planning_lists.py holds them to both.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

import numpy as np

from mechanism_service.core.migration import move_cost_s, waiting_behind
from mechanism_service.core.model import Entry, MechanismState, Placement
from mechanism_service.core.settings import MechanismSettings

# A job with no time received yet ranks above everyone with some, but stays finite so larger
# allocations still sort first (paper section 3.1).
UNSERVED_FACTOR = 1e9

# Below this many ledger rows (live or not) the planner's passes walk Python lists instead of
# calling numpy: a numpy call costs ~1 us whatever its size, a list step ~50 ns, so a cluster of
# tens of GPUs (Gavel's calibration: ~30 entries) plans faster in lists; above it, in numpy.
# Both evaluate the same definition (tests/unit/mechanism/test_planning_fast.py runs both).
SMALL_ROWS = 128


class QueueRow(NamedTuple):
    """One entry in one type's queue (a named tuple: cheap to make in the planner's hot loop)."""

    entry: Entry
    priority: float
    deficit_s: float
    allocation: float


_BY_PRIORITY = operator.itemgetter(1, 2, 3)  # (priority, deficit, allocation)


def priorities(state: MechanismState) -> dict[str, list[QueueRow]]:
    """Per type, every entry in admission order with its priority, deficit and allocation."""
    return {w: [QueueRow(*row) for row in rows] for w, rows in priority_rows(state).items()}


def priority_rows(state: MechanismState) -> dict[str, list[tuple[Entry, float, float, float]]]:
    """``priorities`` as plain (entry, priority, deficit_s, allocation) tuples: the hot loop of a
    simulation (every type x every entry x every round), so one pass over the entries filling
    every type's queue, plain locals and tuples (the same arithmetic, in the same order, as
    the plain type-by-type definition in tests/unit/mechanism/test_planning_fast.py: the schedule
    does not change by a bit)."""
    allocation = state.allocation
    types = state.accelerator_types
    rows: dict[str, list[tuple[Entry, float, float, float]]] = {w: [] for w in types}
    per_type = [(w, rows[w].append, state.type_time_s[w]) for w in types]
    for entry, ledger in state.entries.items():
        shares = allocation.get(entry)
        throughputs, received_s, deficit_s = ledger.throughputs, ledger.received_s, ledger.deficit_s
        for w, append, total_s in per_type:
            share = shares.get(w, 0.0) if shares is not None else 0.0
            if share == 0.0 or min(throughputs[w]) <= 0.0:
                append((entry, 0.0, deficit_s[w], share))
                continue
            received = received_s[w] / total_s if total_s > 0 else 0.0
            append((entry, share / received if received > 0 else share * UNSERVED_FACTOR, deficit_s[w], share))
    return rows


class Queues(NamedTuple):
    """Every type's queue as columns (one row a ledger row, one column a ledger type): what
    ``priority_rows`` lists, for the rows where ``live`` (the others are removed entries)."""

    keys: list[Entry | None]  # row -> entry
    live: np.ndarray  # rows
    priority: np.ndarray  # rows x types
    deficit_s: np.ndarray  # rows x types
    allocation: np.ndarray  # rows x types
    runs: np.ndarray  # rows x types: every member runs there (throughput > 0)


def priority_columns(state: MechanismState) -> Queues:
    """``priority_rows`` as columns: per type, share / (received / the type's time), or share x
    UNSERVED_FACTOR when it received nothing, 0 where the entry has no share or cannot run. Every
    type at once (the operations are elementwise: the same floats as a column at a time, a
    handful of numpy calls a round instead of a handful a type)."""
    ledgers = state.entries
    rows = ledgers.rows
    allocation = ledgers.allocation_matrix(state.allocation)
    throughputs = ledgers.throughputs[:rows]
    runs = np.minimum(throughputs[:, :, 0], throughputs[:, :, 1]) > 0.0
    total_s = [state.type_time_s[w] for w in ledgers.types]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        received = ledgers.received_s[:rows] / np.array(total_s)
        if not all(t > 0 for t in total_s):  # a type no time was handed out on yet: nobody received any
            received = np.where(np.array(total_s) > 0, received, 0.0)
        value = np.where(received > 0, allocation / received, allocation * UNSERVED_FACTOR)
    priority = np.where(runs & (allocation != 0.0), value, 0.0)
    return Queues(ledgers.keys, ledgers.live[:rows], priority, ledgers.deficit_s[:rows], allocation, runs)


def charge_move_columns(
    state: MechanismState, queues: Queues, settings: MechanismSettings, behind: frozenset[int] = frozenset()
) -> Queues:
    """migration.charge_moves on columns: where an entry would start afresh on a type (it did
    not run there last round) and has a priority, the charge is ``move_charge_restores`` times
    the cost for each job it restarts; the priority times (round - charge) / round (never below
    0) and the deficit less the charge; the cost is migration.move_cost_s's (one for all while no
    job type was measured). An entry with a member ``behind`` (core/catch_up.py) is charged 0."""
    ledgers = state.entries
    rows = len(queues.live)
    ran_on = np.full(rows, -1)
    row_of, column_of = ledgers.row_of, ledgers.column_of
    for entry, placement in state.previous_assignment.items():
        row = row_of.get(entry)
        if row is not None:
            ran_on[row] = column_of.get(placement.accelerator_type, -1)
    moving = (queues.priority != 0.0) & (ran_on[:, None] != np.arange(len(ledgers.types))[None, :])
    round_s = settings.round_s
    if state.move_costs_by_job_type:
        cost_s = np.zeros(rows)
        keys = queues.keys
        for row in np.flatnonzero(moving.any(axis=1) & queues.live).tolist():  # removed entries' rows: no cost
            cost_s[row] = move_cost_s(state, keys[row], settings)  # type: ignore[arg-type]
    else:
        cost_s = np.full(rows, settings.restore_s)
    if len(row_of) > len(state.jobs):  # pairs among the entries (a job has one single): a pair restarts two jobs
        members = np.fromiter((len(entry) if entry else 1 for entry in queues.keys[:rows]), float, rows)
        charge_s = settings.move_charge_restores * members * cost_s
    else:
        charge_s = settings.move_charge_restores * cost_s
    if behind:
        charge_s = np.where(_with_member(queues.keys, rows, behind), 0.0, charge_s)
    factor = (np.maximum(0.0, round_s - charge_s) / round_s)[:, None]
    charge_s = charge_s[:, None]
    priority = np.where(moving, queues.priority * factor, queues.priority)
    deficit_s = np.where(moving, queues.deficit_s - charge_s, queues.deficit_s)
    return queues._replace(priority=priority, deficit_s=deficit_s)


def _with_member(keys: Sequence[Entry | None], rows: int, jobs: frozenset[int]) -> np.ndarray:
    """(rows,) True where the row's entry has a member among ``jobs`` (False for a removed row)."""
    return np.fromiter((entry is not None and not jobs.isdisjoint(entry) for entry in keys[:rows]), bool, rows)


class LedgerLists(NamedTuple):
    """The ledgers' columns as flat Python lists, read once a round for a few rows (below
    SMALL_ROWS): a cell (row, column) is ``row * types + column``, its members' rates ``2 * cell``
    and ``2 * cell + 1``. One ``tolist`` a column for the round's passes (holds, their fit, the
    queues) instead of a handful of numpy calls each."""

    types: int
    allocation: list[float]
    received_s: list[float]
    deficit_s: list[float]
    rates: list[float]


def ledger_lists(state: MechanismState) -> LedgerLists | None:
    """The ledgers' columns as lists, or None above SMALL_ROWS rows (there numpy pays)."""
    ledgers = state.entries
    rows = ledgers.rows
    if rows > SMALL_ROWS:
        return None
    return LedgerLists(
        len(ledgers.types),
        ledgers.allocation_matrix(state.allocation).ravel().tolist(),
        ledgers.received_s[:rows].ravel().tolist(),
        ledgers.deficit_s[:rows].ravel().tolist(),
        ledgers.throughputs[:rows].ravel().tolist(),
    )


class TypeQueue(NamedTuple):
    """One type's candidates for ``pick_columns`` from lists: the live rows where every member
    runs there, in admission order, split by whether the entry has a priority there (``served``)
    or not; ``sort_keys[row]`` is the row's (priority, deficit, allocation) there, as
    ``charge_move_columns(priority_columns(...))`` gives them (None: not a candidate)."""

    served: list[int]
    unserved: list[int]
    sort_keys: list[tuple[float, float, float] | None]


class QueueLists(NamedTuple):
    """Every type's queue from lists (``queue_lists``): ``column(k)`` is the type in ledger
    column k's, made at its first call (a type the reserved entries fill is never ranked, so
    never made)."""

    keys: list[Entry | None]
    column: Callable[[int], TypeQueue]


def plan_queues(
    state: MechanismState, settings: MechanismSettings, lists: LedgerLists | None, behind: frozenset[int] = frozenset()
) -> Queues | QueueLists:
    """The queues ``pick_columns`` ranks, moves charged when ``settings.charge_moves`` (but not
    to the entries of jobs ``behind``): from ``lists`` where the round read them (a few rows),
    else on numpy columns."""
    if lists is not None:
        return queue_lists(state, settings, lists, behind)
    queues = priority_columns(state)
    return charge_move_columns(state, queues, settings, behind) if settings.charge_moves else queues


def queue_lists(
    state: MechanismState, settings: MechanismSettings, lists: LedgerLists, behind: frozenset[int] = frozenset()
) -> QueueLists:
    """``priority_columns`` and then, when ``settings.charge_moves``, ``charge_move_columns``,
    fused on Python floats for the cells a pick can visit (the live rows whose every member
    runs there), a type when the pick first asks for it: the same IEEE operations in the same
    order, so the same floats, without ~25 numpy calls on arrays of tens of cells
    (tests/unit/mechanism/test_planning_lists.py holds the two equal). The state must not
    change until the pick is done."""
    made: dict[int, TypeQueue] = {}
    moves: list[tuple[list[str | None], list[tuple[float, float] | None]]] = []  # made with the first type's

    def column(k: int) -> TypeQueue:
        queue = made.get(k)
        if queue is None:
            if not moves:
                moves.append(_moves(state, settings, behind))
            queue = made[k] = _type_queue(state, settings, lists, k, *moves[0])
        return queue

    return QueueLists(state.entries.keys, column)


def _moves(
    state: MechanismState, settings: MechanismSettings, behind: frozenset[int] = frozenset()
) -> tuple[list[str | None], list[tuple[float, float] | None]]:
    """Per ledger row: the type it ran on last round (None: none, or moves are not charged),
    and what a move costs it, (charge_s, the priority's factor) (None: looked up at its first
    move, when job types were measured; (0.0, 1.0) for an entry with a member ``behind``)."""
    ledgers = state.entries
    rows = ledgers.rows
    ran_on: list[str | None] = [None] * rows
    charges: list[tuple[float, float] | None] = [None] * rows
    if not settings.charge_moves:
        return ran_on, charges
    row_of = ledgers.row_of
    for entry, placement in state.previous_assignment.items():
        row = row_of.get(entry)
        if row is not None:
            ran_on[row] = placement.accelerator_type
    if not state.move_costs_by_job_type:  # one cost for all: a single's charge, a pair's
        single, pair = _move_charge(state, settings, (0,), settings.restore_s), _move_charge(state, settings, (0, 1), settings.restore_s)
        charges = [pair if entry is not None and len(entry) == 2 else single for entry in ledgers.keys]
    if behind:  # (x 1.0 and - 0.0: the same floats as no charge)
        for row, entry in enumerate(ledgers.keys[:rows]):
            if entry is not None and not behind.isdisjoint(entry):
                charges[row] = (0.0, 1.0)
    return ran_on, charges


def _move_charge(state: MechanismState, settings: MechanismSettings, entry: Entry, cost_s: float) -> tuple[float, float]:
    """(charge_s, the priority's factor) of the entry's move, as charge_move_columns makes them:
    members counted only where the entries have pairs (x 1 for a single: exact, as restores x
    cost), the factor np.maximum(0.0, round - charge) / round."""
    members = len(entry) if len(state.entries.row_of) > len(state.jobs) else 1
    charge_s = settings.move_charge_restores * members * cost_s
    left_s = settings.round_s - charge_s
    return charge_s, (0.0 if 0.0 >= left_s else left_s) / settings.round_s


def _type_queue(
    state: MechanismState,
    settings: MechanismSettings,
    lists: LedgerLists,
    k: int,
    ran_on: list[str | None],
    charges: list[tuple[float, float] | None],
) -> TypeQueue:
    """``queue_lists``' queue for the type in column k, its cells zipped from strided slices."""
    ledgers = state.entries
    types, rows, w = lists.types, ledgers.rows, ledgers.types[k]
    total_s, charging = state.type_time_s[w], settings.charge_moves
    served: list[int] = []
    unserved: list[int] = []
    sort_keys: list[tuple[float, float, float] | None] = [None] * rows
    cells = zip(
        range(rows), ledgers.keys, lists.allocation[k::types], lists.received_s[k::types], lists.deficit_s[k::types],
        lists.rates[2 * k :: 2 * types], lists.rates[2 * k + 1 :: 2 * types], ran_on, charges,
    )
    for row, entry, share, received, deficit, first_rate, second_rate, ran, charge in cells:
        if entry is None or not (first_rate > 0.0 and second_rate > 0.0):  # np.minimum(...) > 0.0, NaN included
            continue
        if share == 0.0:
            sort_keys[row] = (0.0, deficit, share)
            unserved.append(row)
            continue
        received = received / total_s if total_s > 0 else 0.0
        priority = share / received if received > 0 else share * UNSERVED_FACTOR
        if charging and priority != 0.0 and ran != w:  # it would start afresh here: charged its move
            if charge is None:  # (a cost looked up for the rows that move, as charge_move_columns does)
                charge = charges[row] = _move_charge(state, settings, entry, move_cost_s(state, entry, settings))
            priority *= charge[1]
            deficit -= charge[0]
        sort_keys[row] = (priority, deficit, share)
        (served if priority > 0.0 else unserved).append(row)
    return TypeQueue(served, unserved, sort_keys)


def held_columns(
    state: MechanismState, now_s: float, settings: MechanismSettings, lists: LedgerLists | None = None
) -> list[tuple[Entry, str]]:
    """migration.held_entries on columns: last round's entries that keep their type this round
    (its docstring says which), decided for all of them at once; the same arithmetic in the same
    order, the cost migration.move_cost_s's (one for all while no job type was measured).
    ``lists``: the ledgers' columns as the round read them (``ledger_lists``), when it did."""
    share_limit = settings.move_overhead_share
    previous = state.previous_assignment
    if share_limit is None or not previous:
        return []
    if len(previous) <= SMALL_ROWS:
        return _held_small(state, now_s, settings, share_limit, lists)
    ledgers, jobs = state.entries, state.jobs
    entries = list(previous)
    count = len(entries)
    row_of, column_of = ledgers.row_of, ledgers.column_of
    rows = np.fromiter(map(row_of.get, entries, [-1] * count), int, count)
    columns = np.fromiter(map(column_of.__getitem__, map(_ACCELERATOR_TYPE, previous.values())), int, count)
    present = rows >= 0  # an entry with a member gone has no ledger
    rows = np.where(present, rows, 0)
    share = ledgers.allocation_matrix(state.allocation)[rows, columns]
    rates = ledgers.throughputs[rows, columns]  # count x 2 (a single's value twice)
    candidate = present & (share > 0.0) & (np.minimum(rates[:, 0], rates[:, 1]) > 0.0)
    if state.move_costs_by_job_type:
        cost_s = np.zeros(count)
        for i in np.flatnonzero(candidate).tolist():
            cost_s[i] = move_cost_s(state, entries[i], settings)
    else:
        cost_s = np.full(count, max(0.0, settings.restore_s))
    stretches = state.stretch_rounds
    stretch = np.fromiter(map(stretches.get, entries, [1] * count), float, count)
    candidate &= ~(stretch * settings.round_s * share_limit >= cost_s)
    # seconds until the first member finishes at its rate there
    pairs = np.fromiter(map(len, entries), int, count) == 2
    first = _steps_remaining(jobs, map(_FIRST_MEMBER, entries), count)
    second = _steps_remaining(jobs, map(_LAST_MEMBER, entries), count) if pairs.any() else first
    with np.errstate(divide="ignore", invalid="ignore"):
        finishes_s = np.where(pairs, np.minimum(first / rates[:, 0], second / rates[:, 1]), first / rates[:, 0])
    candidate &= ~(finishes_s * share_limit < cost_s)
    since_reset_s = now_s - state.last_reset_s
    owed_s = ledgers.deficit_s[rows, columns] + share * since_reset_s - (ledgers.received_s[rows, columns] - settings.seed_s)
    held = candidate & (owed_s + cost_s * settings.move_overshoot_moves > 0.0)
    return [(entries[i], previous[entries[i]].accelerator_type) for i in np.flatnonzero(held).tolist()]


def _held_small(
    state: MechanismState, now_s: float, settings: MechanismSettings, share_limit: float, lists: LedgerLists | None
) -> list[tuple[Entry, str]]:
    """``held_columns`` for a few entries: the ledgers' cells read from ``lists`` (or in one
    gather), the tests made an entry at a time on Python floats (the same IEEE operations, in
    the same order)."""
    ledgers = state.entries
    row_of, column_of = ledgers.row_of, ledgers.column_of
    types = len(ledgers.types)  # the arrays are C-ordered rows x types: a cell is row x types + column
    if lists is not None:  # the cells that can hold (a share, every member runs), read as found
        allocation, rates = lists.allocation, lists.rates
        deficits_s, received_s = lists.deficit_s, lists.received_s
        cells = [
            (entry, w, share, rates[2 * cell], rates[2 * cell + 1], deficits_s[cell], received_s[cell])
            for entry, p in state.previous_assignment.items()
            if (row := row_of.get(entry)) is not None
            and (share := allocation[cell := row * types + column_of[w := p.accelerator_type]]) > 0.0
            and rates[2 * cell] > 0.0
            and rates[2 * cell + 1] > 0.0
        ]
        return _holds(state, now_s, settings, share_limit, cells)
    found = [(entry, p.accelerator_type, row) for entry, p in state.previous_assignment.items() if (row := row_of.get(entry)) is not None]
    if not found:
        return []
    at = np.array([row * types + column_of[w] for _, w, row in found])
    shares = ledgers.allocation_matrix(state.allocation).take(at).tolist()
    pairs = ledgers.throughputs.reshape(-1, 2).take(at, axis=0).tolist()
    deficits, received = ledgers.deficit_s.take(at).tolist(), ledgers.received_s.take(at).tolist()
    gathered = [
        (entry, w, share, first_rate, second_rate, deficit_s, received_s)
        for (entry, w, _), share, (first_rate, second_rate), deficit_s, received_s in zip(found, shares, pairs, deficits, received)
        if share > 0.0 and first_rate > 0.0 and second_rate > 0.0  # (a NaN fails, as in numpy)
    ]
    return _holds(state, now_s, settings, share_limit, gathered)


def _holds(
    state: MechanismState,
    now_s: float,
    settings: MechanismSettings,
    share_limit: float,
    cells: Iterable[tuple[Entry, str, float, float, float, float, float]],
) -> list[tuple[Entry, str]]:
    """``_held_small``'s tests past the first (a share there, every member runs there), on each
    candidate's (entry, type, share, first and second member's rate, deficit_s, received_s)."""
    jobs = state.jobs
    measured, uniform_cost_s = bool(state.move_costs_by_job_type), max(0.0, settings.restore_s)
    stretches, round_s, seed_s = state.stretch_rounds, settings.round_s, settings.seed_s
    overshoot, since_reset_s = settings.move_overshoot_moves, now_s - state.last_reset_s
    held = []
    for entry, w, share, first_rate, second_rate, deficit_s, received in cells:
        cost_s = move_cost_s(state, entry, settings) if measured else uniform_cost_s
        if float(stretches.get(entry, 1)) * round_s * share_limit >= cost_s:
            continue
        job = jobs.get(entry[0])  # steps left as _steps_remaining reads them (0 for a job gone)
        finishes_s = (float(job.total_steps - job.steps_done) if job is not None else 0.0) / first_rate
        if len(entry) == 2:
            job = jobs.get(entry[1])
            finishes_s = min(finishes_s, (float(job.total_steps - job.steps_done) if job is not None else 0.0) / second_rate)
        if finishes_s * share_limit < cost_s:
            continue
        owed_s = deficit_s + share * since_reset_s - (received - seed_s)
        if owed_s + cost_s * overshoot > 0.0:
            held.append((entry, w))
    return held


_ACCELERATOR_TYPE = operator.attrgetter("accelerator_type")
_FIRST_MEMBER = operator.itemgetter(0)
_LAST_MEMBER = operator.itemgetter(-1)


class _Gone(NamedTuple):
    """A job no longer here, as _steps_remaining reads it: no steps left."""

    total_steps: int = 0
    steps_done: int = 0


def _steps_remaining(jobs: Mapping[int, object], indices: Iterable[int], count: int) -> np.ndarray:
    """(count,) each job's steps_remaining as a float (0 for a job gone), read in C: integers
    subtracted as integers, then converted, as float(job.steps_remaining) is."""
    found = list(map(jobs.get, indices, itertools.repeat(_Gone())))
    total = np.fromiter(map(_TOTAL_STEPS, found), np.int64, count)
    done = np.fromiter(map(_STEPS_DONE, found), np.int64, count)
    return (total - done).astype(float)


_TOTAL_STEPS = operator.attrgetter("total_steps")
_STEPS_DONE = operator.attrgetter("steps_done")


def fit_held_columns(
    state: MechanismState,
    held: Sequence[tuple[Entry, str]],
    reserved: Sequence[tuple[Entry, str]],
    lists: LedgerLists | None = None,
    behind: frozenset[int] = frozenset(),
) -> list[tuple[Entry, str]]:
    """migration.fit_held with its pass over the jobs that never ran on columns: the newcomers
    found in C (their ``first_run_s`` is None), the GPUs their allocation takes on each type
    summed from the ledgers' allocation matrix (integers: the same counts as one subtraction at
    a time; from ``lists`` where the round read them); the reserved and held entries, few, as
    the plain form walks them. The jobs ``behind`` and in no held entry count as newcomers."""
    left = dict(state.gpus)
    jobs, ledgers = state.jobs, state.entries
    newcomers = list(itertools.compress(jobs.values(), map(operator.is_, map(_FIRST_RUN, jobs.values()), itertools.repeat(None))))
    if behind:
        newcomers += [jobs[j] for j in waiting_behind(jobs, held, behind)]
    if newcomers and lists is not None:
        allocation, types, row_of = lists.allocation, lists.types, ledgers.row_of
        columns = [(k, w) for w, k in ledgers.column_of.items() if w in left]
        for job in newcomers:
            first_cell = row_of[(job.index,)] * types
            for k, w in columns:
                if allocation[first_cell + k] > 0.0:
                    left[w] -= job.scale_factor
    elif newcomers:
        count = len(newcomers)
        rows = np.fromiter(map(ledgers.row_of.__getitem__, zip(map(_INDEX, newcomers))), np.intp, count)
        scale = np.fromiter(map(_SCALE_FACTOR, newcomers), np.int64, count)
        shares = ledgers.allocation_matrix(state.allocation)[rows]
        for w, k in ledgers.column_of.items():
            if w in left:
                left[w] -= int(scale[shares[:, k] > 0.0].sum())
    taken: set[int] = set()
    for entry, w in reserved:
        left[w] -= jobs[entry[0]].scale_factor
        taken.update(entry)
    fitting = []
    for entry, w in held:
        scale_factor = jobs[entry[0]].scale_factor
        if taken.isdisjoint(entry) and left.get(w, 0) >= scale_factor:
            left[w] -= scale_factor
            taken.update(entry)
            fitting.append((entry, w))
    return fitting


_FIRST_RUN = operator.attrgetter("first_run_s")
_INDEX = operator.attrgetter("index")
_SCALE_FACTOR = operator.attrgetter("scale_factor")


def pick_columns(
    state: MechanismState,
    queues: Queues | QueueLists,
    order: Sequence[str],
    settings: MechanismSettings,
    *,
    reserved: Sequence[tuple[Entry, str]] = (),
) -> dict[str, list[tuple[Entry, int]]]:
    """``pick`` on columns: each type's candidates (live, every member runs there, and a
    priority under FIFO) sorted by (priority, deficit, allocation), highest first, ties in
    admission order (a stable lexsort of the negated keys is Python's stable reverse sort), then
    the same greedy pass."""
    left = dict(state.gpus)
    taken: set[int] = set()
    jobs = state.jobs
    for entry, w in reserved:
        left[w] -= jobs[entry[0]].scale_factor
        taken.update(entry)
    picked: dict[str, list[tuple[Entry, int]]] = {w: [] for w in order}
    column_of, keys = state.entries.column_of, queues.keys
    if isinstance(queues, QueueLists):
        ranking = _ranked_lists(queues, settings.only_allocated_run)
    else:
        ranked_rows = _ranked_rows_small if len(queues.live) <= SMALL_ROWS else _ranked_rows
        ranking = ranked_rows(queues, settings.only_allocated_run)
    for allocated, w in _passes(order, settings):
        free = left[w]
        if free == 0:
            continue
        chosen = picked[w]
        for row in ranking(column_of[w], allocated):
            entry: Entry = keys[row]  # type: ignore[assignment]
            if entry[0] in taken or (len(entry) > 1 and entry[1] in taken):
                continue
            scale_factor = jobs[entry[0]].scale_factor
            if scale_factor > free:
                continue
            free -= scale_factor
            taken.update(entry)
            chosen.append((entry, scale_factor))
            if free == 0:
                break
        left[w] = free
    for entry, w in reserved:
        picked.setdefault(w, []).append((entry, jobs[entry[0]].scale_factor))
    return picked


Ranking = Callable[[int, "bool | None"], list[int]]


def _ranked_rows(queues: Queues, fifo: bool) -> Ranking:
    """pick_columns' candidates on one type (column ``k``; ``allocated``: only those with (True)
    or without (False) a priority there), highest (priority, deficit, allocation) first, ties in
    admission order: a stable lexsort of the negated keys is Python's stable reverse sort. A
    type's candidates are sorted once, its passes take their part of that order (a stable sort
    of a part is the part of the stable sort)."""
    ranked: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def ranking(k: int, allocated: bool | None) -> list[int]:
        if k not in ranked:
            candidates = queues.live & queues.runs[:, k]
            if fifo:
                candidates &= queues.priority[:, k] > 0.0
            rows = np.flatnonzero(candidates)
            rows = rows[np.lexsort((-queues.allocation[rows, k], -queues.deficit_s[rows, k], -queues.priority[rows, k]))]
            ranked[k] = (rows, queues.priority[rows, k] > 0.0)
        rows, served = ranked[k]
        return (rows if allocated is None else rows[served == allocated]).tolist()

    return ranking


def _ranked_rows_small(queues: Queues, fifo: bool) -> Ranking:
    """``_ranked_rows`` on Python lists (a few rows): the columns read once a round, a type's
    candidates filtered and sorted (stable, reversed) in lists, once for its passes."""
    live = np.flatnonzero(queues.live).tolist()
    runs, priority = queues.runs.T.tolist(), queues.priority.T.tolist()
    deficit_s, allocation = queues.deficit_s.T.tolist(), queues.allocation.T.tolist()
    ranked: dict[int, list[int]] = {}

    def ranking(k: int, allocated: bool | None) -> list[int]:
        p = priority[k]
        rows = ranked.get(k)
        if rows is None:
            ok = runs[k]
            rows = [r for r in live if ok[r] and (not fifo or p[r] > 0.0)]
            rows.sort(key=list(zip(p, deficit_s[k], allocation[k])).__getitem__, reverse=True)  # keys made in C
            ranked[k] = rows
        return rows if allocated is None else [r for r in rows if (p[r] > 0.0) == allocated]

    return ranking


def _ranked_lists(queues: QueueLists, fifo: bool) -> Ranking:
    """``_ranked_rows`` on ``queue_lists``' candidates: a part (those with a priority there, or
    those without) sorted alone is that part of the whole sorted (a stable sort); the whole is
    put back in admission order before it is sorted, so ties keep it."""
    ranked: dict[tuple[int, bool | None], list[int]] = {}
    column = queues.column

    def ranking(k: int, allocated: bool | None) -> list[int]:
        if fifo and allocated is None:  # only entries with a priority run
            allocated = True
        rows = ranked.get((k, allocated))
        if rows is None:
            served, unserved, sort_keys = column(k)
            if allocated is None:
                rows = sorted(served + unserved)  # (admission order again: ties keep it even against a NaN)
            elif allocated:
                rows = list(served)
            else:
                rows = [] if fifo else list(unserved)
            rows.sort(key=sort_keys.__getitem__, reverse=True)
            ranked[(k, allocated)] = rows
        return rows

    return ranking


def _passes(order: Sequence[str], settings: MechanismSettings) -> list[tuple[bool | None, str]]:
    """The queues in visiting order; with ``allocated_first`` (core/settings.py), every type's
    entries with a priority there (an allocation) before any type's others, which only fill
    GPUs left idle (Gavel: one pass, so a spare GPU of the first type visited went to an entry
    the allocation gives nothing there, however slow it is there)."""
    if settings.allocated_first:
        return [(True, w) for w in order] + [(False, w) for w in order]
    return [(None, w) for w in order]


def type_order(state: MechanismState, settings: MechanismSettings) -> list[str]:
    """The fixed visiting order, restricted to the cluster's types (others last, by name)."""
    known = [w for w in settings.type_order if w in state.gpus]
    return known + sorted(w for w in state.gpus if w not in known)


def pick(
    state: MechanismState,
    queues: Mapping[str, Sequence[tuple[Entry, float, float, float]]],
    order: Sequence[str],
    settings: MechanismSettings,
    *,
    reserved: Sequence[tuple[Entry, str]] = (),
) -> dict[str, list[tuple[Entry, int]]]:
    """Greedy selection: each type's queue sorted by (priority, deficit, allocation), highest
    first (stable: ties keep admission order), the queues concatenated in visiting order; an
    entry is taken at its first occurrence that fits, a gang takes all its GPUs on one type, a
    gang that does not fit is skipped so smaller entries may still use the GPUs. ``reserved``
    entries (profiling runs) are picked first, on their type, whatever their priority."""
    left = dict(state.gpus)
    taken: set[int] = set()
    for entry, w in reserved:
        left[w] -= state.jobs[entry[0]].scale_factor
        taken.update(entry)
    picked: dict[str, list[tuple[Entry, int]]] = {w: [] for w in order}
    entries, jobs, fifo = state.entries, state.jobs, settings.only_allocated_run
    for allocated, w in _passes(order, settings):
        free = left[w]
        chosen = picked[w]
        for row in sorted(queues[w], key=_BY_PRIORITY, reverse=True):
            if free == 0:
                break
            if allocated is not None and (row[1] > 0.0) != allocated:
                continue
            entry = row[0]
            if entry[0] in taken or (len(entry) > 1 and entry[1] in taken):
                continue
            if min(entries[entry].throughputs[w]) <= 0.0:
                continue
            if fifo and row[1] <= 0.0:
                continue
            scale_factor = jobs[entry[0]].scale_factor
            if scale_factor > free:
                continue
            free -= scale_factor
            taken.update(entry)
            chosen.append((entry, scale_factor))
        left[w] = free
    for entry, w in reserved:
        picked.setdefault(w, []).append((entry, state.jobs[entry[0]].scale_factor))
    return picked


def place(
    state: MechanismState,
    picked: dict[str, list[tuple[Entry, int]]],
    order: Sequence[str],
    settings: MechanismSettings,
    forced: frozenset[Entry] = frozenset(),
) -> dict[Entry, Placement]:
    """Workers for each picked entry: largest gangs first; an entry that ran on this type last
    round keeps its workers when they are all still free (a lease extension); others take the
    lowest free workers, filling a server before moving to the next (consolidation). ``forced``
    entries (profiling runs) are placed even where the allocation gives them nothing."""
    assignment: dict[Entry, Placement] = {}
    for w in order:
        entries = sorted(picked.get(w, ()), key=_SIZE, reverse=True)
        if not entries:
            continue
        if settings.extensions_first:
            # Every size extended before any fresh placement: no continuing entry is moved off
            # its GPUs by a larger gang placed afresh (Gavel places sizes in turn).
            _place_extensions_first(state, w, entries, state.servers[w], assignment, settings, forced)
            continue
        servers = [list(s) for s in state.servers[w]]
        cursor = 0
        used: set[int] = set()
        sizes = sorted({s for _, s in entries}, reverse=True)
        for size in sizes:  # Gavel: each size extended, then placed afresh, largest first
            for entry, _ in (p for p in entries if p[1] == size):  # pass 1: extensions
                previous = state.previous_assignment.get(entry)
                if previous is not None and previous.accelerator_type == w and not used & set(previous.worker_ids):
                    assignment[entry] = previous
                    used.update(previous.worker_ids)
            for entry, scale_factor in (p for p in entries if p[1] == size):  # pass 2: fresh placements
                if entry in assignment:
                    continue
                if entry not in state.allocation and not settings.run_unallocated and entry not in forced:
                    continue  # picked but not allocated: its GPUs idle this round (Gavel)
                workers: list[int] = []
                while len(workers) < scale_factor:
                    if cursor >= len(servers):
                        raise RuntimeError(f"{w}: no free worker for {entry} (planner and placement disagree)")
                    server = servers[cursor]
                    if not server:
                        cursor += 1
                        continue
                    worker = server.pop(0)
                    if worker not in used:
                        workers.append(worker)
                assignment[entry] = Placement(w, tuple(workers))
                used.update(workers)
    return assignment


_SIZE = operator.itemgetter(1)


def _place_extensions_first(
    state: MechanismState,
    w: str,
    entries: list[tuple[Entry, int]],
    servers: Sequence[Sequence[int]],
    assignment: dict[Entry, Placement],
    settings: MechanismSettings,
    forced: frozenset[Entry],
) -> None:
    """``place`` for one type with every extension first; then each fresh entry, largest first,
    takes the first server with room for its whole gang (so the GPUs extensions keep do not split
    a gang that would fit on one server), else the lowest free workers."""
    used: set[int] = set()
    previous_of = state.previous_assignment.get
    fresh: list[tuple[Entry, int]] = []  # the entries placed afresh, largest first
    for picked in entries:
        previous = previous_of(picked[0])
        if previous is not None and previous.accelerator_type == w and used.isdisjoint(previous.worker_ids):
            assignment[picked[0]] = previous
            used.update(previous.worker_ids)
        else:
            fresh.append(picked)
    free: list[list[int]] | None = None  # each server's free workers, listed at the first fresh entry
    first = 0  # servers before this one are full
    for entry, scale_factor in fresh:
        if entry in assignment:
            continue
        if entry not in state.allocation and not settings.run_unallocated and entry not in forced:
            continue
        if free is None:  # (most rounds extend every entry: then no server is listed)
            free = [list(itertools.filterfalse(used.__contains__, server)) for server in servers]
        while first < len(free) and not free[first]:
            first += 1
        room = next((k for k in range(first, len(free)) if len(free[k]) >= scale_factor), None) if scale_factor > 1 else first
        workers: list[int] = []
        if room is not None and room < len(free):
            workers, free[room] = free[room][:scale_factor], free[room][scale_factor:]
        k = first
        while len(workers) < scale_factor:
            if k >= len(free):
                raise RuntimeError(f"{w}: no free worker for {entry} (planner and placement disagree)")
            take = free[k][: scale_factor - len(workers)]
            free[k] = free[k][len(take):]
            workers += take
            k += 1
        assignment[entry] = Placement(w, tuple(workers))


def count_extensions(
    state: MechanismState, assignment: dict[Entry, Placement], kept: frozenset[Entry] | None = None
) -> tuple[int, int]:
    """Section 6.3: (extended, opportunities) for this round against the previous one
    (``kept``: kept_entries of the assignment, when the caller has it)."""
    jobs = state.jobs
    # an entry is one job or a pair: "some member still here" is its first or last
    opportunities = sum(1 for entry in state.previous_assignment if entry[0] in jobs or entry[-1] in jobs)
    return len(kept_entries(state, assignment) if kept is None else kept), opportunities


def kept_entries(state: MechanismState, assignment: Mapping[Entry, Placement]) -> frozenset[Entry]:
    """The entries that keep last round's placement (lease extensions). An extension is placed
    with last round's Placement object itself, so identity answers before equality is asked."""
    previous = state.previous_assignment.get
    return frozenset(e for e, p in assignment.items() if (q := previous(e)) is p or q == p)
