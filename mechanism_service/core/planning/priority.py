"""Step 2 of a round's plan: each type's queue, every entry with its priority there
(allocation / share of the type's time it received), its deficit and its allocation, and each
move charged what it costs (paper section 3.1; docs/mechanism.md, "What a move costs").

The row form ``priority_rows`` is the definition (``priorities`` its named rows);
``priority_columns`` and ``charge_move_columns`` are the same arithmetic on the ledgers'
columns, ``queue_lists`` the two fused on Python lists for a few rows. They sit together here
so the definition and the forms held to it (test_planning_fast.py, test_planning_lists.py)
read side by side; the charges' row form is migration.charge_moves.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from mechanism_service.core.migration import move_cost_s
from mechanism_service.core.model import Entry, MechanismState
from mechanism_service.core.planning.ledger_reads import LedgerLists, with_member
from mechanism_service.core.settings import MechanismSettings

# A job with no time received yet ranks above everyone with some, but stays finite so larger
# allocations still sort first (paper section 3.1).
UNSERVED_FACTOR = 1e9


class QueueRow(NamedTuple):
    """One entry in one type's queue (a named tuple: cheap to make in the planner's hot loop)."""

    entry: Entry
    priority: float
    deficit_s: float
    allocation: float


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
    ran_on = _ran_on(state, rows)
    moving = (queues.priority != 0.0) & (ran_on[:, None] != np.arange(len(ledgers.types))[None, :])
    round_s = settings.round_s
    if state.move_costs_by_job_type:
        cost_s = np.zeros(rows)
        keys = queues.keys
        for row in np.flatnonzero(moving.any(axis=1) & queues.live).tolist():  # removed entries' rows: no cost
            cost_s[row] = move_cost_s(state, keys[row], settings)  # type: ignore[arg-type]
    else:
        cost_s = np.full(rows, settings.restore_s)
    members = ledgers.members[:rows]
    if len(ledgers.row_of) > len(state.jobs):  # pairs among the entries (a job has one single): a pair restarts two jobs
        # a row's member count from its (first, last) members: 2 where they differ (a pair), else
        # 1 (a single, and a removed row's (-1, -1)): len(entry), as floats 1.0 and 2.0
        charge_s = settings.move_charge_restores * (1.0 + (members[:, 0] != members[:, 1])) * cost_s
    else:
        charge_s = settings.move_charge_restores * cost_s
    if behind:
        charge_s = np.where(with_member(members, behind), 0.0, charge_s)
    factor = (np.maximum(0.0, round_s - charge_s) / round_s)[:, None]
    charge_s = charge_s[:, None]
    priority = np.where(moving, queues.priority * factor, queues.priority)
    deficit_s = np.where(moving, queues.deficit_s - charge_s, queues.deficit_s)
    return queues._replace(priority=priority, deficit_s=deficit_s)


def _ran_on(state: MechanismState, rows: int) -> np.ndarray:
    """(rows,) the ledger column each row's entry ran on last round (-1: it did not run, or its
    type is not a ledger column), looked up in C over last round's assignment."""
    ledgers = state.entries
    ran_on = np.full(rows, -1)
    previous = state.previous_assignment
    count = len(previous)
    if not count:
        return ran_on
    at = np.fromiter(map(ledgers.row_of.get, previous, itertools.repeat(-1, count)), np.intp, count)
    columns = np.fromiter(
        map(ledgers.column_of.get, map(_ACCELERATOR_TYPE, previous.values()), itertools.repeat(-1, count)), np.intp, count,
    )
    found = at >= 0  # an entry with a member gone has no ledger row
    ran_on[at[found]] = columns[found]  # (rows are distinct: each entry has one)
    return ran_on


_ACCELERATOR_TYPE = operator.attrgetter("accelerator_type")


class TypeQueue(NamedTuple):
    """One type's candidates for ``pick_columns`` from lists: the live rows where every member
    runs there, in admission order (``candidates``), split by whether the entry has a priority
    there (``served``) or not; ``sort_keys[row]`` is the row's (priority, deficit, allocation)
    there, as ``charge_move_columns(priority_columns(...))`` gives them (None: not a candidate)."""

    served: list[int]
    unserved: list[int]
    sort_keys: list[tuple[float, float, float] | None]
    candidates: list[int]


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
    (tests/unit/mechanism/test_planning_lists.py holds the two equal). What does not change
    between two changes of the ledgers (which cells are candidates, their shares, deficits and
    uniform charges: ``_type_cells``) is kept in them; a round computes only what its time moved,
    the served cells' priorities. The state must not change until the pick is done."""
    made: dict[int, TypeQueue] = {}
    moves: list[tuple[dict[int, str], dict[int, tuple[float, float]]]] = []  # made with the first type's

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
) -> tuple[dict[int, str], dict[int, tuple[float, float]]]:
    """This round's part of the charges: ledger row -> the type it ran on last round (empty when
    moves are not charged), and ledger row -> its charge where it is not the one ``_type_cells``
    keeps: (0.0, 1.0) for an entry with a member ``behind`` (x 1.0 and - 0.0: the same floats as
    no charge); a measured cost's charge is added at the row's first move."""
    ran_on: dict[int, str] = {}
    charges: dict[int, tuple[float, float]] = {}
    if not settings.charge_moves:
        return ran_on, charges
    row_of = state.entries.row_of
    for entry, placement in state.previous_assignment.items():
        row = row_of.get(entry)
        if row is not None:
            ran_on[row] = placement.accelerator_type
    if behind:
        for row, entry in enumerate(state.entries.keys[: state.entries.rows]):
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
    return charge_s, (0.0 if 0.0 >= left_s else left_s) / settings.round_s  # noqa: FURB136 (np.maximum's NaN: kept)


class TypeCells(NamedTuple):
    """One type's cells as the ledgers give them, the same from one round to the next until the
    ledgers change (``Ledgers.derived``): the candidates (live rows whose every member runs
    there) in row order; those without a share there (priority 0, whatever the time: their sort
    keys, (0.0, deficit, share), are made here, None in ``sort_keys`` for every other row); and
    each other candidate's (row, entry, cell, share, deficit, its move's charge: None when it is
    looked up at its first move, job types being measured)."""

    candidates: list[int]
    unserved: list[int]
    sort_keys: list[tuple[float, float, float] | None]
    served: list[tuple[int, Entry, int, float, float, tuple[float, float] | None]]


def _type_cells(state: MechanismState, settings: MechanismSettings, lists: LedgerLists, k: int) -> TypeCells:
    """The type in column k's TypeCells, kept in the ledgers' ``derived`` with what they were
    made for (the settings, whether job types were measured, the job count: a pair's charge
    counts its members only where the entries have pairs)."""
    ledgers = state.entries
    stamp = (settings, bool(state.move_costs_by_job_type), len(state.jobs))
    kept = ledgers.derived.get("type_cells")
    if kept is None or kept[0] != stamp:  # type: ignore[index]
        kept = ledgers.derived["type_cells"] = (stamp, [None] * len(ledgers.types))
    by_type: list[TypeCells | None] = kept[1]  # type: ignore[index]
    cells = by_type[k]
    if cells is None:
        cells = by_type[k] = _make_type_cells(state, settings, lists, k)
    return cells


def _make_type_cells(state: MechanismState, settings: MechanismSettings, lists: LedgerLists, k: int) -> TypeCells:
    ledgers = state.entries
    types, rows = lists.types, ledgers.rows
    single = pair = None  # one cost for all (no job type measured): a single's charge, a pair's
    if settings.charge_moves and not state.move_costs_by_job_type:
        single, pair = _move_charge(state, settings, (0,), settings.restore_s), _move_charge(state, settings, (0, 1), settings.restore_s)
    candidates: list[int] = []
    unserved: list[int] = []
    sort_keys: list[tuple[float, float, float] | None] = [None] * rows
    served: list[tuple[int, Entry, int, float, float, tuple[float, float] | None]] = []
    cells = zip(
        range(rows), ledgers.keys, lists.allocation[k::types], lists.deficit_s[k::types],
        lists.rates[2 * k :: 2 * types], lists.rates[2 * k + 1 :: 2 * types],
    )
    for row, entry, share, deficit, first_rate, second_rate in cells:
        if entry is None or not (first_rate > 0.0 and second_rate > 0.0):  # np.minimum(...) > 0.0, NaN included
            continue
        candidates.append(row)
        if share == 0.0:
            sort_keys[row] = (0.0, deficit, share)
            unserved.append(row)
        else:
            served.append((row, entry, row * types + k, share, deficit, pair if len(entry) == 2 else single))
    return TypeCells(candidates, unserved, sort_keys, served)


def _type_queue(
    state: MechanismState,
    settings: MechanismSettings,
    lists: LedgerLists,
    k: int,
    ran_on: dict[int, str],
    charges: dict[int, tuple[float, float]],
) -> TypeQueue:
    """``queue_lists``' queue for the type in column k: its TypeCells, and each served cell's
    priority from the time it received (``lists.received_s``), charged where it would move."""
    cells = _type_cells(state, settings, lists, k)
    w = state.entries.types[k]
    total_s, charging, received_s = state.type_time_s[w], settings.charge_moves, lists.received_s
    served: list[int] = []
    unserved: list[int] = []
    sort_keys = list(cells.sort_keys)
    for row, entry, cell, share, deficit, charge in cells.served:
        received = received_s[cell] / total_s if total_s > 0 else 0.0
        priority = share / received if received > 0 else share * UNSERVED_FACTOR
        if charging and priority != 0.0 and ran_on.get(row) != w:  # it would start afresh here: charged its move
            charge = charges.get(row, charge)
            if charge is None:  # (a cost looked up for the rows that move, as charge_move_columns does)
                charge = charges[row] = _move_charge(state, settings, entry, move_cost_s(state, entry, settings))
            priority *= charge[1]
            deficit -= charge[0]
        sort_keys[row] = (priority, deficit, share)
        (served if priority > 0.0 else unserved).append(row)
    if unserved:  # (rare: a share whose priority is not above 0) in row order with the others
        unserved = sorted(cells.unserved + unserved)
    else:
        unserved = cells.unserved
    return TypeQueue(served, unserved, sort_keys, cells.candidates)
