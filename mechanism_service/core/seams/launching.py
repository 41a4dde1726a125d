"""The mechanism's side of the launch seam (core/seams/launch.py): the candidates per type (the
pick's, then last round's entries it did not pick), the strategy's answer checked, the picked
lists rebuilt from it. Profiling runs stay launched whatever it says. Pure: an answer that
cannot be used leaves the pick as it was and returns an error text the shell logs."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from common.plugins import PLUGIN_FAULTS
from mechanism_service.core.model import Entry, MechanismState
from mechanism_service.core.seams.launch import (
    Candidate,
    LaunchStrategy,
    LaunchView,
    answer_problem,
)


def launch_with(
    strategy: LaunchStrategy,
    state: MechanismState,
    picked: dict[str, list[tuple[Entry, int]]],
    forced: frozenset[Entry],
) -> tuple[dict[str, list[tuple[Entry, int]]], str]:
    """(the entries to place per type, "" or why the strategy's answer was not used)."""
    free = dict(state.gpus)
    keyed: dict[int, Entry] = {}
    candidates: dict[str, list[Candidate]] = {w: [] for w in state.gpus}
    on_type: dict[str, set[Entry]] = {w: set() for w in state.gpus}
    for w, entries in picked.items():
        for entry, scale_factor in entries:
            if entry in forced:
                free[w] -= scale_factor
                continue
            previous = state.previous_assignment.get(entry)
            running = previous is not None and previous.accelerator_type == w
            candidates[w].append(_candidate(state, keyed, entry, scale_factor, w, picked=True, running=running))
            on_type[w].add(entry)
    for entry, placement in state.previous_assignment.items():
        w = placement.accelerator_type
        if w not in candidates or entry in on_type[w] or entry in forced or not _live(state, entry, w):
            continue
        scale_factor = state.jobs[entry[0]].scale_factor
        candidates[w].append(_candidate(state, keyed, entry, scale_factor, w, picked=False, running=True))
    view = LaunchView(free, {w: tuple(c) for w, c in candidates.items()})
    try:
        answer = strategy.launch(view)
        if isinstance(answer, Mapping):  # read once: keys as a generator would pass the check and launch nothing
            with contextlib.suppress(TypeError):  # (answer_problem says what is not a sequence)
                answer = {w: list(keys) for w, keys in answer.items()}
        problem = answer_problem(view, answer)
        if not problem:
            forced_jobs = {i for entry in forced for i in entry}
            clash = [keyed[k] for keys in answer.values() for k in keys if forced_jobs & set(keyed[k])]
            problem = f"{'+'.join(state.job_ids_of(clash[0]))} launched beside its profiling run" if clash else ""
    except PLUGIN_FAULTS as error:  # a plug-in may raise anything: the round goes on (sys.exit too)
        problem = f"raised {type(error).__name__}: {error}"
    if problem:
        return picked, problem
    launched: dict[str, list[tuple[Entry, int]]] = {w: [] for w in picked}
    for w, keys in answer.items():
        launched.setdefault(w, []).extend((keyed[k], state.jobs[keyed[k][0]].scale_factor) for k in keys)
    for w, entries in picked.items():  # profiling runs last, where the pick puts them
        launched[w].extend(p for p in entries if p[0] in forced)
    return launched, ""


def _candidate(
    state: MechanismState, keyed: dict[int, Entry], entry: Entry, scale_factor: int, w: str, *, picked: bool, running: bool
) -> Candidate:
    key = len(keyed)
    keyed[key] = entry
    return Candidate(key, state.job_ids_of(entry), scale_factor, w, picked=picked, running=running)


def _live(state: MechanismState, entry: Entry, w: str) -> bool:
    """Last round's entry may launch again: its jobs are all active, it runs on the type."""
    ledger = state.entries.get(entry)
    return all(i in state.jobs for i in entry) and ledger is not None and min(ledger.throughputs[w]) > 0.0
