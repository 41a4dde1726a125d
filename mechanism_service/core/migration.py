"""What moving a job costs, and which running entries keep their GPUs because of it
(docs/mechanism.md, "What a move costs").

A lease that is not an extension starts its job afresh: the process starts and restores its
checkpoint before its first step. That time is lost to the job (the simulated hardware charges
``settings.restore_s``; real workers report how long it took). Priorities alone re-decide every
round, and under heterogeneity-aware LAS about half of all leases move: the job that just ran
has received the most, so it gives way next round, and pays the restore again when it comes
back. Here a move is charged against what it buys: an entry that moved keeps its GPUs, ahead of
the greedy pass, until the restore it paid is at most ``move_overhead_share`` of the time it has
run there since (1%: 20 s restores buy stretches of at least 2,000 s), unless it would overshoot
its allocation there or finish before the stretch pays. Fairness is not given up,
only its grain: the time-sharing is the same, in longer stretches, and the ledgers charge the
held rounds to the entry like any other, so its priority pays them back afterwards.

Pure: reads a MechanismState; ``note_move_cost`` and ``next_stretches`` are the only writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mechanism_service.core.model import Entry, JobState, MechanismState, Placement
from mechanism_service.core.settings import MechanismSettings


def note_move_cost(state: MechanismState, job_type: str, seconds: float) -> None:
    """A real worker measured what a fresh start of a job of this type cost (start-up and
    restore): kept as a sum and a count, so the cost used is the mean of every move measured."""
    if seconds <= 0.0:
        return
    total_s, count = state.move_costs_by_job_type.get(job_type, (0.0, 0))
    state.move_costs_by_job_type[job_type] = (total_s + seconds, count + 1)


def move_cost_s(state: MechanismState, entry: Entry, settings: MechanismSettings) -> float:
    """What moving the entry costs: the slowest member's measured mean for its job type, or
    ``settings.restore_s`` for a type never measured (the simulator measures none)."""
    costs = state.move_costs_by_job_type
    worst = 0.0
    for i in entry:
        measured = costs.get(state.jobs[i].job_type)
        worst = max(worst, measured[0] / measured[1] if measured else settings.restore_s)
    return worst


def held_entries(state: MechanismState, now_s: float, settings: MechanismSettings) -> list[tuple[Entry, str]]:
    """Last round's entries that keep their type this round, in last round's order: the entry
    is still schedulable (no member left), it runs on that type, its stretch there has not yet
    paid for its move, it will not finish before a stretch would (its first member to finish,
    at its rate there: holding a short job on its slower type costs its finish time most, and
    saves no move), and the allocation still owes it time there: its deficit on the type
    (the folded deficit, plus its share of the time since the reset, less what it received since)
    may go below zero by ``move_overshoot_moves`` moves' cost, never more, so a job is not kept on
    a type far past its share there (a short job on its slower type loses the most)."""
    share_limit = settings.move_overhead_share
    if share_limit is None:
        return []
    held = []
    allocation, entries, stretches = state.allocation, state.entries, state.stretch_rounds
    since_reset_s = now_s - state.last_reset_s
    jobs = state.jobs
    # move_cost_s's answer for every entry while no job type was measured (the simulator)
    measured, uniform_cost_s = bool(state.move_costs_by_job_type), max(0.0, settings.restore_s)
    for entry, placement in state.previous_assignment.items():
        ledger = entries.get(entry)
        if ledger is None:
            continue
        w = placement.accelerator_type
        share = allocation.get(entry, {}).get(w, 0.0)
        if share <= 0.0 or min(ledger.throughputs[w]) <= 0.0:
            continue
        cost_s = move_cost_s(state, entry, settings) if measured else uniform_cost_s
        if stretches.get(entry, 1) * settings.round_s * share_limit >= cost_s:
            continue
        rates = ledger.throughputs[w]
        finishes_s = jobs[entry[0]].steps_remaining / rates[0] if len(entry) == 1 else _finishes_within_s(state, entry, rates)
        if finishes_s * share_limit < cost_s:
            continue  # it ends before a stretch would pay for the move: nothing to amortise
        owed_s = ledger.deficit_s[w] + share * since_reset_s - (ledger.received_s[w] - settings.seed_s)
        if owed_s + cost_s * settings.move_overshoot_moves > 0.0:
            held.append((entry, w))
    return held


def charge_moves(
    state: MechanismState,
    rows: dict[str, list[tuple[Entry, float, float, float]]],
    settings: MechanismSettings,
    behind: frozenset[int] = frozenset(),
) -> dict[str, list[tuple[Entry, float, float, float]]]:
    """The planner's queues with each move charged what it costs: an entry that would start
    afresh on a type (it did not run there last round) is charged ``move_charge_restores`` times
    its move cost for each job it restarts; its priority is scaled by the share of the round left
    after the charge, (round - charge) / round (never below 0), and its deficit, the tie-break, is
    reduced by the charge (the deficit a move repairs is net of the time it sets off losing).
    Entries that continue where they ran are left as they are, and so are the entries with a
    member ``behind`` (core/catch_up.py): the charge kept them from the time they are owed."""
    ran_on = {entry: p.accelerator_type for entry, p in state.previous_assignment.items()}
    round_s = settings.round_s
    measured = bool(state.move_costs_by_job_type)
    charged = {}
    for w, type_rows in rows.items():
        out = []
        for row in type_rows:
            entry = row[0]
            if row[1] == 0.0 or ran_on.get(entry) == w or not behind.isdisjoint(entry):
                out.append(row)
                continue
            cost_s = move_cost_s(state, entry, settings) if measured else settings.restore_s
            charge_s = settings.move_charge_restores * len(entry) * cost_s
            factor = max(0.0, round_s - charge_s) / round_s
            out.append((entry, row[1] * factor, row[2] - charge_s, row[3]))
        charged[w] = out
    return charged


def _finishes_within_s(state: MechanismState, entry: Entry, throughputs: Sequence[float]) -> float:
    """Seconds until the entry's first member finishes, alone at these rates."""
    return min(state.jobs[i].steps_remaining / t for i, t in zip(entry, throughputs, strict=True))


def fit_held(
    state: MechanismState,
    held: Sequence[tuple[Entry, str]],
    reserved: Sequence[tuple[Entry, str]],
    behind: frozenset[int] = frozenset(),
) -> list[tuple[Entry, str]]:
    """The held entries that still fit after the ``reserved`` ones (profiling runs come first):
    no member already reserved, and GPUs of its type left (a lost worker may have taken some)
    after the jobs that never ran: a hold never keeps a newcomer waiting, its first lease pays a
    restore anyway, and a short job waiting rounds for a stretch to end would lose the most.
    Nor a job ``behind`` (core/catch_up.py) that no held entry runs: its GPUs are left as a
    newcomer's."""
    left = dict(state.gpus)
    waiting = frozenset(waiting_behind(state.jobs, held, behind))
    for newcomer in state.jobs.values():
        if newcomer.first_run_s is None or newcomer.index in waiting:
            for w, share in state.allocation.get((newcomer.index,), {}).items():
                if share > 0.0 and w in left:
                    left[w] -= newcomer.scale_factor
    taken: set[int] = set()
    for entry, w in reserved:
        left[w] -= state.jobs[entry[0]].scale_factor
        taken.update(entry)
    fitting = []
    for entry, w in held:
        scale_factor = state.jobs[entry[0]].scale_factor
        if taken.isdisjoint(entry) and left.get(w, 0) >= scale_factor:
            left[w] -= scale_factor
            taken.update(entry)
            fitting.append((entry, w))
    return fitting


def waiting_behind(jobs: Mapping[int, JobState], held: Sequence[tuple[Entry, str]], behind: frozenset[int]) -> list[int]:
    """The jobs ``behind`` that the holds would keep waiting, in index order: each has run before
    (one that never ran is a newcomer already) and is in no held entry."""
    if not behind:
        return []
    in_held = {j for entry, _ in held for j in entry}
    return [j for j in sorted(behind) if j in jobs and jobs[j].first_run_s is not None and j not in in_held]


def next_stretches(
    previous: Mapping[Entry, int], assignment: Mapping[Entry, Placement], kept: frozenset[Entry]
) -> dict[Entry, int]:
    """Rounds each entry of this round will have run on its GPUs: one more for an extension, 1
    for a fresh start."""
    return {entry: previous.get(entry, 0) + 1 if entry in kept else 1 for entry in assignment}


def kept_and_stretches(
    previous: Mapping[Entry, Placement], stretches: Mapping[Entry, int], assignment: Mapping[Entry, Placement]
) -> tuple[frozenset[Entry], dict[Entry, int]]:
    """planning/placement.kept_entries (the entries that keep last round's placement: its very object,
    or an equal one) and ``next_stretches`` of them, in one pass over the assignment."""
    previous_of, stretch_of = previous.get, stretches.get
    kept = []
    following = {}
    for entry, placement in assignment.items():
        if (last := previous_of(entry)) is placement or last == placement:
            kept.append(entry)
            following[entry] = stretch_of(entry, 0) + 1
        else:
            following[entry] = 1
    return frozenset(kept), following
