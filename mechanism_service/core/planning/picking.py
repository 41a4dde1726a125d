"""Step 3 of a round's plan: the greedy pick over the per-type queues (docs/gavel-semantics.md
section 5): each type's queue by (priority, deficit, allocation), fastest type first, an entry
at its first place that fits, gangs whole.

``pick`` on the queues' rows is the definition; ``pick_columns`` is the same pass on the
queues priority.py makes as columns or lists, its candidates ranked in numpy, or in lists for a
few rows (ledger_reads.SMALL_ROWS). Both sit here so the definition and the form held to it
(test_planning_fast.py, test_planning_lists.py) read side by side.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from mechanism_service.core.model import Entry, MechanismState
from mechanism_service.core.planning import ledger_reads
from mechanism_service.core.planning.priority import QueueLists, Queues
from mechanism_service.core.settings import MechanismSettings

_BY_PRIORITY = operator.itemgetter(1, 2, 3)  # (priority, deficit, allocation)


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


def _passes(order: Sequence[str], settings: MechanismSettings) -> list[tuple[bool | None, str]]:
    """The queues in visiting order; with ``allocated_first`` (core/settings.py), every type's
    entries with a priority there (an allocation) before any type's others, which only fill
    GPUs left idle (Gavel: one pass, so a spare GPU of the first type visited went to an entry
    the allocation gives nothing there, however slow it is there)."""
    if settings.allocated_first:
        return [(True, w) for w in order] + [(False, w) for w in order]
    return [(None, w) for w in order]


def type_order(state: MechanismState, settings: MechanismSettings) -> list[str]:
    """The fixed visiting order, restricted to the cluster's types (others last, by name): a new
    list each call (the agnostic policies shuffle it in place)."""
    return list(_type_order(settings.type_order, tuple(state.gpus)))


@functools.lru_cache(maxsize=64)
def _type_order(preferred: tuple[str, ...], types: tuple[str, ...]) -> tuple[str, ...]:
    """``type_order`` of a cluster's types (asked every round, the same answer for a run)."""
    known = [w for w in preferred if w in types]
    return (*known, *sorted(w for w in types if w not in known))


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
    column_of, keys, every = state.entries.column_of, queues.keys, len(jobs)
    if isinstance(queues, QueueLists):
        ranking = _ranked_lists(queues, settings.only_allocated_run)
    else:
        if len(queues.live) <= ledger_reads.SMALL_ROWS:
            ranking = _ranked_rows_small(queues, settings.only_allocated_run)
        else:
            ranking = _untaken(_ranked_rows(queues, settings.only_allocated_run), state.entries.members, taken)
    for allocated, w in _passes(order, settings):
        if len(taken) >= every and taken.issuperset(jobs):
            break  # every job is taken: no entry is left to pick (nor a type's queue to rank)
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
            if len(taken) >= every and taken.issuperset(jobs):
                break  # every job is taken: no later row can be (with pairs, most rows are left then)
        left[w] = free
    for entry, w in reserved:
        picked.setdefault(w, []).append((entry, jobs[entry[0]].scale_factor))
    return picked


Ranking = Callable[[int, "bool | None"], list[int]]


def _ranked_rows(queues: Queues, fifo: bool) -> Callable[[int, bool | None], np.ndarray]:
    """pick_columns' candidates on one type (column ``k``; ``allocated``: only those with (True)
    or without (False) a priority there), highest (priority, deficit, allocation) first, ties in
    admission order: a stable lexsort of the negated keys is Python's stable reverse sort. A
    type's candidates are sorted once, its passes take their part of that order (a stable sort
    of a part is the part of the stable sort)."""
    ranked: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def ranking(k: int, allocated: bool | None) -> np.ndarray:
        if k not in ranked:
            candidates = queues.live & queues.runs[:, k]
            if fifo:
                candidates &= queues.priority[:, k] > 0.0
            rows = np.flatnonzero(candidates)
            rows = rows[np.lexsort((-queues.allocation[rows, k], -queues.deficit_s[rows, k], -queues.priority[rows, k]))]
            ranked[k] = (rows, queues.priority[rows, k] > 0.0)
        rows, served = ranked[k]
        return rows if allocated is None else rows[served == allocated]

    return ranking


def _untaken(ranking: Callable[[int, bool | None], np.ndarray], members: np.ndarray, taken: set[int]) -> Ranking:
    """``ranking``'s rows less those with a member already taken when a pass starts (the greedy
    pass would skip each of them: ``taken`` only grows), found in numpy from the rows' (first,
    last) members: with pairs, most of a late pass's rows, which the pass would walk one by one."""

    def untaken(k: int, allocated: bool | None) -> list[int]:
        rows = ranking(k, allocated)
        if taken and len(rows):
            rows = rows[~ledger_reads.with_member(members[rows], taken)]
        return rows.tolist()

    return untaken


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
            served, unserved, sort_keys, candidates = column(k)
            if allocated is None:
                rows = list(candidates)  # (admission order again: ties keep it even against a NaN)
            elif allocated:
                rows = list(served)
            else:
                rows = [] if fifo else list(unserved)
            rows.sort(key=sort_keys.__getitem__, reverse=True)
            ranked[(k, allocated)] = rows
        return rows

    return ranking
