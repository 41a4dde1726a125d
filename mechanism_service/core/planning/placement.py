"""Step 4 of a round's plan: concrete workers for each picked entry (docs/gavel-semantics.md
section 6): a continuing entry keeps its GPUs (a lease extension), others fill a server before
the next; and what this round kept of the last one (section 6.3). One form: it walks the picked
entries, a few per type, so it has no fast form to be held to.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping, Sequence

from mechanism_service.core.model import Entry, MechanismState, Placement
from mechanism_service.core.settings import MechanismSettings


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
    previous_of, allocation, run_unallocated = state.previous_assignment.get, state.allocation, settings.run_unallocated
    for w in order:
        entries = sorted(picked.get(w, ()), key=_SIZE, reverse=True)
        if not entries:
            continue
        if settings.extensions_first:
            # Every size extended before any fresh placement: no continuing entry is moved off
            # its GPUs by a larger gang placed afresh (Gavel places sizes in turn).
            _place_extensions_first(state, w, entries, state.servers[w], assignment, settings, forced)
            continue
        # the lowest free worker first, a server at a time: each worker is passed once (Gavel's
        # servers copied and popped from the front: the same sequence, without the copies)
        workers_in_order = itertools.chain.from_iterable(state.servers[w])
        used: set[int] = set()
        for _, group in itertools.groupby(entries, key=_SIZE):  # Gavel: each size extended, then placed afresh, largest first
            sized = list(group)
            for entry, _ in sized:  # pass 1: extensions
                previous = previous_of(entry)
                if previous is not None and previous.accelerator_type == w and used.isdisjoint(previous.worker_ids):
                    assignment[entry] = previous
                    used.update(previous.worker_ids)
            for entry, scale_factor in sized:  # pass 2: fresh placements
                if entry in assignment:
                    continue
                if entry not in allocation and not run_unallocated and entry not in forced:
                    continue  # picked but not allocated: its GPUs idle this round (Gavel)
                if scale_factor == 1:  # (most entries: the loop below for one worker)
                    for worker in workers_in_order:
                        if worker not in used:
                            break
                    else:
                        raise RuntimeError(f"{w}: no free worker for {entry} (planner and placement disagree)")
                    used.add(worker)
                    assignment[entry] = Placement(w, (worker,))
                    continue
                workers: list[int] = []
                while len(workers) < scale_factor:
                    worker = next(workers_in_order, None)
                    if worker is None:
                        raise RuntimeError(f"{w}: no free worker for {entry} (planner and placement disagree)")
                    if worker not in used:
                        workers.append(worker)
                        used.add(worker)
                assignment[entry] = Placement(w, tuple(workers))
    return assignment


_SIZE = operator.itemgetter(1)
_FIRST = operator.itemgetter(0)


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
    if not fresh:
        return
    if fresh[0][1] == 1:  # every fresh entry takes one GPU (largest first): below, each takes the lowest free worker
        _place_singles(state, w, fresh, servers, used, assignment, settings, forced)
        return
    # each server's free workers, listed when a fresh entry first looks at the server (most
    # rounds extend every entry, and a fresh one looks at the first servers with room only)
    free: list[list[int] | None] = [None] * len(servers)

    def free_at(k: int) -> list[int]:
        workers = free[k]
        if workers is None:
            workers = free[k] = list(itertools.filterfalse(used.__contains__, servers[k]))
        return workers

    count = len(servers)
    first = 0  # servers before this one are full
    for entry, scale_factor in fresh:
        if entry in assignment:
            continue
        if entry not in state.allocation and not settings.run_unallocated and entry not in forced:
            continue
        while first < count and not free_at(first):
            first += 1
        room = next((k for k in range(first, count) if len(free_at(k)) >= scale_factor), None) if scale_factor > 1 else first
        workers: list[int] = []
        if room is not None and room < count:
            workers, free[room] = free_at(room)[:scale_factor], free_at(room)[scale_factor:]
        k = first
        while len(workers) < scale_factor:
            if k >= count:
                raise RuntimeError(f"{w}: no free worker for {entry} (planner and placement disagree)")
            take = free_at(k)[: scale_factor - len(workers)]
            free[k] = free_at(k)[len(take):]
            workers += take
            k += 1
        assignment[entry] = Placement(w, tuple(workers))


def _place_singles(
    state: MechanismState,
    w: str,
    fresh: list[tuple[Entry, int]],
    servers: Sequence[Sequence[int]],
    used: set[int],
    assignment: dict[Entry, Placement],
    settings: MechanismSettings,
    forced: frozenset[Entry],
) -> None:
    """``_place_extensions_first``'s fresh placements when each takes one GPU: its first server
    with a free worker and that server's first free worker, i.e. the lowest free worker in
    server order, which one pass over the workers hands out in turn (the same workers, without
    each server's free list)."""
    free_workers = itertools.filterfalse(used.__contains__, itertools.chain.from_iterable(servers))
    allocation, run_unallocated = state.allocation, settings.run_unallocated
    for entry, _ in fresh:
        if entry in assignment:
            continue
        if entry not in allocation and not run_unallocated and entry not in forced:
            continue
        worker = next(free_workers, None)
        if worker is None:
            raise RuntimeError(f"{w}: no free worker for {entry} (planner and placement disagree)")
        assignment[entry] = Placement(w, (worker,))


def count_extensions(
    state: MechanismState, assignment: dict[Entry, Placement], kept: frozenset[Entry] | None = None
) -> tuple[int, int]:
    """Section 6.3: (extended, opportunities) for this round against the previous one
    (``kept``: kept_entries of the assignment, when the caller has it)."""
    jobs, previous = state.jobs, state.previous_assignment
    # an entry is one job or a pair: "some member still here" is its first or last (the first
    # counted in C; the last looked at only where the first has left)
    present = list(map(jobs.__contains__, map(_FIRST, previous)))
    opportunities = sum(present)
    if opportunities < len(previous):
        opportunities += sum(1 for entry, first in zip(previous, present) if not first and entry[-1] in jobs)
    return len(kept_entries(state, assignment) if kept is None else kept), opportunities


def kept_entries(state: MechanismState, assignment: Mapping[Entry, Placement]) -> frozenset[Entry]:
    """The entries that keep last round's placement (lease extensions). An extension is placed
    with last round's Placement object itself, so identity answers before equality is asked."""
    previous = state.previous_assignment.get
    return frozenset(e for e, p in assignment.items() if (q := previous(e)) is p or q == p)
