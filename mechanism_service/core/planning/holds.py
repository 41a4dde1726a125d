"""Step 1 of a round's plan: last round's entries that keep their GPUs this round, and those of
them that still fit (docs/mechanism.md, "What a move costs").

Their row forms, the definitions, are migration.held_entries and migration.fit_held, beside the
rest of what a move costs; ``held_columns`` and ``fit_held_columns`` are the same arithmetic in
the same order on the ledgers' columns (or, for a few entries, on the lists the round read:
ledger_reads), held to them exactly by test_planning_fast.py, test_planning_lists.py and
test_boundary_fast.py.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import numpy as np

from mechanism_service.core.migration import move_cost_s, waiting_behind
from mechanism_service.core.model import Entry, MechanismState
from mechanism_service.core.planning import ledger_reads
from mechanism_service.core.planning.ledger_reads import LedgerLists
from mechanism_service.core.settings import MechanismSettings


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
    if len(previous) <= ledger_reads.SMALL_ROWS:
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
    previous = state.previous_assignment.items()
    if not state.move_costs_by_job_type:  # one cost for all: a stretch that paid for it is out first
        cost_s, stretches, round_s = max(0.0, settings.restore_s), state.stretch_rounds, settings.round_s
        previous = [(entry, p) for entry, p in previous if not float(stretches.get(entry, 1)) * round_s * share_limit >= cost_s]
        if not previous:
            return []
    if lists is not None:  # the cells that can hold (a share, every member runs), read as found
        allocation, rates = lists.allocation, lists.rates
        deficits_s, received_s = lists.deficit_s, lists.received_s
        cells = [
            (entry, w, share, rates[2 * cell], rates[2 * cell + 1], deficits_s[cell], received_s[cell])
            for entry, p in previous
            if (row := row_of.get(entry)) is not None
            and (share := allocation[cell := row * types + column_of[w := p.accelerator_type]]) > 0.0
            and rates[2 * cell] > 0.0
            and rates[2 * cell + 1] > 0.0
        ]
        return _holds(state, now_s, settings, share_limit, cells)
    found = [(entry, p.accelerator_type, row) for entry, p in previous if (row := row_of.get(entry)) is not None]
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
        if measured:
            cost_s = move_cost_s(state, entry, settings)
            if float(stretches.get(entry, 1)) * round_s * share_limit >= cost_s:
                continue
        else:  # (_held_small left out every stretch that paid for the one cost)
            cost_s = uniform_cost_s
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
    if not held:  # (what fits is some of the held: none)
        return []
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
