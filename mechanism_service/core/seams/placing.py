"""The mechanism's side of the placement seam (core/seams/placement.py): per type, the lease
extensions kept, the request built, the strategy's answer checked and turned into Placements.
Pure: a strategy that raises or answers wrong gives the round to ``consolidated``
(core/planning/placement.py) and an error text the shell logs."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

from common.plugins import PLUGIN_FAULTS
from mechanism_service.core.model import Entry, MechanismState, Placement
from mechanism_service.core.planning.placement import place
from mechanism_service.core.seams.placement import (
    Gang,
    PlacementRequest,
    PlacementStrategy,
    answer_problem,
)
from mechanism_service.core.settings import MechanismSettings


def place_with(
    strategy: PlacementStrategy,
    state: MechanismState,
    picked: dict[str, list[tuple[Entry, int]]],
    order: Sequence[str],
    settings: MechanismSettings,
    forced: frozenset[Entry] = frozenset(),
) -> tuple[dict[Entry, Placement], str]:
    """(the assignment, "" or why the strategy's answer was not used). Per type, largest gangs
    first: every entry that ran on this type last round keeps its workers when they are all
    still free (a lease extension, whatever the strategy); the others the strategy places."""
    assignment: dict[Entry, Placement] = {}
    for w in order:
        entries = sorted(picked.get(w, ()), key=lambda p: p[1], reverse=True)
        if not entries:
            continue
        used: set[int] = set()
        fresh: list[tuple[Entry, int]] = []
        for entry, scale_factor in entries:
            previous = state.previous_assignment.get(entry)
            if previous is not None and previous.accelerator_type == w and used.isdisjoint(previous.worker_ids):
                assignment[entry] = previous
                used.update(previous.worker_ids)
            elif entry in state.allocation or settings.run_unallocated or entry in forced:
                fresh.append((entry, scale_factor))
            # else: picked but not allocated: its GPUs idle this round (Gavel)
        if not fresh:
            continue
        request = _request(state, w, fresh, used)
        try:
            answer = strategy.place(request)
            with contextlib.suppress(TypeError):  # (answer_problem says what it is instead)
                # read once: a generator of generators would pass the check and then place nothing
                answer = [tuple(workers) for workers in answer]
            problem = answer_problem(request, answer)
        except PLUGIN_FAULTS as error:  # a plug-in may raise anything: the round goes on (sys.exit too)
            problem = f"raised {type(error).__name__}: {error}"
        if problem:
            return place(state, picked, order, settings, forced=forced), f"{w}: {problem}"
        for (entry, _), workers in zip(fresh, answer):
            assignment[entry] = Placement(w, tuple(workers))
    return assignment, ""


def _request(state: MechanismState, w: str, fresh: list[tuple[Entry, int]], used: set[int]) -> PlacementRequest:
    servers = tuple(tuple(server) for server in state.servers[w])
    free = tuple(tuple(x for x in server if x not in used) for server in servers)
    gangs = []
    for entry, scale_factor in fresh:
        last = state.previous_assignment.get(entry) or state.last_placements.get(entry[0])
        gangs.append(Gang(
            state.job_ids_of(entry), scale_factor,
            last.accelerator_type if last is not None else None, last.worker_ids if last is not None else (),
        ))
    return PlacementRequest(w, servers, free, tuple(gangs))


def remember_placements(state: MechanismState, assignment: Mapping[Entry, Placement]) -> None:
    """Where each job's last lease ran (a Gang's ``last_workers`` beyond last round), kept only
    while a strategy other than the default places; ended jobs' are forgotten as the jobs go."""
    last = state.last_placements
    for entry, placement in assignment.items():
        for index in entry:
            last[index] = placement
    if len(last) > 2 * len(state.jobs) + 64:
        state.last_placements = {i: p for i, p in last.items() if i in state.jobs}
