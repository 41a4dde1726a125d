"""Quiet rounds: when the next boundaries' plans are this one's, so a simulator may run them
without planning them (sim/quiet.py decides which boundaries are quiet and advances them).

Between two events that can change a decision (an arrival, a completion, a failure, a reset),
the planner's inputs change only by the time the round credited: each entry's received time,
each type's total. Those move the priorities, so they can reorder a type's queue, but under
the conditions ``steady_plan`` checks the reordering cannot change who runs where:

- every active job runs, each alone (no pair entries), no profiling run, the default seams;
- the greedy pick has slack: in every pass (docs/gavel-semantics.md section 5) the candidates
  not yet taken fit in the free GPUs, so each entry is taken at its first pass whatever the
  queue's order; which passes an entry is a candidate in depends only on the allocation, its
  throughputs and whether its priority is above 0, which none of the round's credit changes
  (an entry's priority is above 0 exactly where it has a share, as long as a move's charge
  leaves some of a round: checked); with a reshuffled type order (the agnostic policies), each
  entry must be a candidate on one type only of its first block of passes;
- that pick is this round's plan: then every entry keeps its workers next round (an extension
  of each, as placement.place extends a continuing entry) and the plan repeats.

What the order still changes is the order of the assignment itself: the round's record sums
its GPU time exactly rounded (rounds.lease_totals), settling sorts the leases by their finish,
and the one other reader of the order, the holds' fit (planning/holds.py: last round's entries
in last round's order, while GPUs last), is out of play once no entry can be held:
``rounds_until_hold_free`` says when, and the simulator only advances a boundary without
planning it when every boundary up to then will be quiet too, so a boundary that is planned
again sees an assignment whose order cannot matter.

Under Gavel's mechanism an agnostic policy's plans differ from round to round (its type order
is drawn each round, and a job goes where the draw says), but when every type has room for
every job that can run there and the jobs are of one size, the draw alone makes the plan:
``drawn_plans`` says when, ``drawn_plan`` makes it (no charges, no holds: no order to keep).

Pure: reads a MechanismState (``replay`` writes what open_round writes).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mechanism_service.core.migration import move_cost_s
from mechanism_service.core.model import Entry, MechanismState, Placement
from mechanism_service.core.planning.picking import _passes, type_order
from mechanism_service.core.reducers import record_first_runs
from mechanism_service.core.rounds import RoundPlan
from mechanism_service.core.seams.chosen import Chosen
from mechanism_service.core.settings import MechanismSettings


def steady_plan(state: MechanismState, plan: RoundPlan, settings: MechanismSettings, chosen: Chosen) -> RoundPlan | None:
    """The plan the next boundaries would make if nothing but time changes before them (the
    module docstring): ``plan``'s assignment with every entry kept; None when that cannot be
    shown from this state."""
    assignment = plan.assignment
    jobs = state.jobs
    if (
        chosen.launch is not None or chosen.placement is not None or plan.jobs_waiting or plan.profiled
        or plan.seam_errors or not assignment or len(assignment) != len(jobs) or len(state.entries) != len(jobs)
    ):
        return None
    if settings.charge_moves and not _charges_leave_a_round(state, settings):
        return None
    taken = _slack_pick(state, settings)
    if taken is None or len(taken) != len(assignment):
        return None
    for entry, placement in assignment.items():
        if taken.get(entry) != placement.accelerator_type:
            return None
    kept = frozenset(assignment)
    return RoundPlan(assignment, kept, len(kept), len(kept), 0)


def _charges_leave_a_round(state: MechanismState, settings: MechanismSettings) -> bool:
    """Whether every entry's move charge leaves some of a round (priority.py: the priority times
    (round - charge) / round), so a charged priority is above 0 wherever the uncharged one is,
    and which entries a move charge, or a job fallen behind (catch_up.py), cannot matter."""
    restores = settings.move_charge_restores
    if not state.move_costs_by_job_type:
        return settings.round_s - restores * settings.restore_s > 0.0
    return all(settings.round_s - restores * move_cost_s(state, entry, settings) > 0.0 for entry in state.entries)


def _slack_pick(state: MechanismState, settings: MechanismSettings) -> dict[Entry, str] | None:
    """Entry -> type of the greedy pick when every pass has room for all its candidates (then
    the queues' order cannot matter), else None; None too when a reshuffled type order could
    put an entry on another type. Read from the ledgers' columns as the planner reads them: an
    entry runs on a type where every member's rate is above 0, and has a priority above 0 there
    where its share is above 0 (priority.py)."""
    ledgers = state.entries
    rows = ledgers.rows
    runs, served = _runs_and_served(state)
    if settings.shuffle_type_order and _several_types(state, settings, runs, served):
        return None
    runs_on, served_on = runs.tolist(), served.tolist()
    jobs, fifo = state.jobs, settings.only_allocated_run
    column = ledgers.column_of
    cells = [
        (entry, jobs[entry[0]].scale_factor, runs_on[row], served_on[row])
        for row, entry in enumerate(ledgers.keys[:rows])
        if entry is not None
    ]

    def candidate(runs: list[bool], served: list[bool], allocated: bool | None, k: int) -> bool:
        """Whether the entry is in the pass's ranking (picking.py): it runs there; under FIFO
        only with a priority; in an allocated-first pass, with (True) or without (False) one."""
        if not runs[k] or (fifo and not served[k]):
            return False
        return allocated is None or served[k] == allocated

    left = dict(state.gpus)
    taken: dict[Entry, tuple[str, bool | None]] = {}  # entry -> (type, the pass's kind)
    for allocated, w in _passes(type_order(state, settings), settings):
        k = column[w]
        here = [(entry, gpus) for entry, gpus, runs, served in cells if entry not in taken and candidate(runs, served, allocated, k)]
        need = sum(gpus for _, gpus in here)
        if need > left[w]:
            return None
        left[w] -= need
        for entry, _ in here:
            taken[entry] = (w, allocated)
    if settings.shuffle_type_order:  # the passes' order is drawn each round: one type each, or none
        for entry, _, runs, served in cells:
            at = taken.get(entry)
            if at is not None and sum(candidate(runs, served, at[1], k) for k in range(len(runs))) != 1:
                return None
    return {entry: w for entry, (w, _) in taken.items()}


def _runs_and_served(state: MechanismState) -> tuple[np.ndarray, np.ndarray]:
    """(rows x types) where each ledger row runs (every member's rate above 0) and where it also
    has a share, so a priority above 0 (priority.py)."""
    ledgers = state.entries
    rates = ledgers.throughputs[: ledgers.rows]
    runs = (rates[:, :, 0] > 0.0) & (rates[:, :, 1] > 0.0)
    return runs, runs & (ledgers.allocation_matrix(state.allocation) > 0.0)


def _several_types(state: MechanismState, settings: MechanismSettings, runs: np.ndarray, served: np.ndarray) -> bool:
    """Whether some entry has several types it could be picked on first (among those it has a
    share on, with allocated-first passes; among those it runs on, else): under a type order
    drawn each round, which it goes to is the draw's."""
    several = (served if settings.allocated_first else runs).sum(axis=1) > 1
    return bool(several[state.entries.live[: state.entries.rows]].any())


def moves_with_the_draw(state: MechanismState, settings: MechanismSettings) -> bool:
    """``steady_plan``'s usual refusal under a type order drawn each round (the agnostic
    policies), alone: true while the allocation and the jobs stay as they are, so a caller may
    remember it until either changes."""
    return settings.shuffle_type_order and _several_types(state, settings, *_runs_and_served(state))


@dataclass(frozen=True, slots=True)
class DrawnPlans:
    """Under Gavel's mechanism with a type order drawn each round (an agnostic policy: one pass per
    type, every entry a candidate wherever it runs, no charges, no holds), when every type has room
    for every job that can run there and every job is one entry of one size: each job goes to the
    first type of the draw it can run on, whatever the priorities, so the draw alone makes the
    plan (``plan``). ``types``: each entry's candidate types."""

    types: dict[Entry, frozenset[str]]
    sizes: dict[Entry, int]
    everywhere: bool = False  # every entry runs on every type: all go to the first type drawn


def drawn_plans(state: MechanismState, settings: MechanismSettings, chosen: Chosen) -> DrawnPlans | None:
    """The plans of the next quiet boundaries as a function of their draws, when the state allows
    (DrawnPlans), else None. It holds while the allocation and the jobs stay as they are."""
    jobs = state.jobs
    if (
        not settings.shuffle_type_order or settings.allocated_first or settings.charge_moves
        or settings.move_overhead_share is not None or settings.catch_up_ratio is not None
        or chosen.launch is not None or chosen.placement is not None or not jobs or len(state.entries) != len(jobs)
    ):
        return None
    if len({job.scale_factor for job in jobs.values()}) != 1:  # sizes placed in turn: a gang may move a smaller job
        return None
    if not settings.run_unallocated and any(entry not in state.allocation for entry in state.entries):
        return None
    runs, served = _runs_and_served(state)
    can = (runs & served) if settings.only_allocated_run else runs
    ledgers = state.entries
    column = ledgers.types
    types: dict[Entry, frozenset[str]] = {}
    sizes: dict[Entry, int] = {}
    need = dict.fromkeys(state.gpus, 0)
    for row, entry in enumerate(ledgers.keys[: ledgers.rows]):
        if entry is None:
            continue
        on = frozenset(w for w, ok in zip(column, can[row].tolist(), strict=True) if ok and w in state.gpus)
        if not on:
            return None
        types[entry] = on
        sizes[entry] = jobs[entry[0]].scale_factor
        for w in on:
            need[w] += sizes[entry]
    if any(need[w] > state.gpus[w] for w in need):
        return None
    return DrawnPlans(types, sizes, everywhere=all(len(on) == len(state.gpus) for on in types.values()))


def drawn_plan(state: MechanismState, plans: DrawnPlans, order: list[str]) -> RoundPlan:
    """The plan open_round makes under ``order`` (drawn): each entry on the first type of the order
    it can run on, last round's placement kept where it stays, the lowest free workers where it
    moves (which free workers a moved entry takes changes no outcome: every lease of a type runs
    alike, and a kept lease keeps its own)."""
    previous = state.previous_assignment
    rank = {w: k for k, w in enumerate(order)}
    going: dict[str, list[Entry]] = {w: [] for w in order}
    for entry, on in plans.types.items():
        going[min(on, key=rank.__getitem__)].append(entry)
    assignment: dict[Entry, Placement] = {}
    kept = []
    for w in order:
        moving = []
        used: set[int] = set()
        for entry in going[w]:
            last = previous.get(entry)
            if last is not None and last.accelerator_type == w:
                assignment[entry] = last
                kept.append(entry)
                used.update(last.worker_ids)
            else:
                moving.append(entry)
        if moving:
            free = [worker for server in state.servers[w] for worker in server if worker not in used]
            for entry in moving:
                size = plans.sizes[entry]
                assignment[entry], free = Placement(w, tuple(free[:size])), free[size:]
    return RoundPlan(assignment, frozenset(kept), len(kept), len(previous), 0)


def hold_threshold_rounds(cost_s: float, settings: MechanismSettings) -> float:
    """The stretch (rounds run in a row on its GPUs) from which an entry whose move costs
    ``cost_s`` can no longer be held (holds.py: a stretch whose time x ``move_overhead_share``
    has paid for the move, the same test in the same float operations); 0 when nothing is ever
    held, inf when no stretch pays."""
    share_limit = settings.move_overhead_share
    if share_limit is None:
        return 0.0
    if not settings.round_s * share_limit > 0.0 or not math.isfinite(cost_s):
        return math.inf

    def pays(stretch: float) -> bool:
        return stretch * settings.round_s * share_limit >= cost_s

    stretch = max(1.0, float(math.ceil(cost_s / (settings.round_s * share_limit))) - 1.0)
    while not pays(stretch):  # the quotient rounded: at most a step or two from the first that pays
        stretch += 1.0
    return stretch


def rounds_until_hold_free(state: MechanismState, plan: RoundPlan, settings: MechanismSettings) -> float:
    """How many boundaries after this one (whose plan is ``plan``, its stretches counted in
    ``state.stretch_rounds``) may still hold one of its entries: 0 when none can be held at the
    next boundary, inf when one can be held however long it runs."""
    if settings.move_overhead_share is None or not plan.assignment:
        return 0.0
    stretches = state.stretch_rounds
    if not state.move_costs_by_job_type:  # one cost for every entry (the simulator measures none)
        shortest = min(stretches.get(entry, 1) for entry in plan.assignment)
        return max(0.0, hold_threshold_rounds(max(0.0, settings.restore_s), settings) - shortest)
    return max(
        max(0.0, hold_threshold_rounds(move_cost_s(state, entry, settings), settings) - stretches.get(entry, 1))
        for entry in plan.assignment
    )


def replay(
    state: MechanismState, plan: RoundPlan, now_s: float, settings: MechanismSettings,
    shuffle: Callable[[list[str]], None] | None,
) -> None:
    """What rounds.open_round writes when its plan is ``plan``, a steady or a drawn plan: the type
    order's draw (``shuffle``; None: the caller drew it), the stretches, the extension counts, the
    first runs."""
    if settings.shuffle_type_order and shuffle is not None:
        shuffle(type_order(state, settings))  # the draw open_round makes, for the stream to stay in step
    assignment = plan.assignment
    stretches, kept = state.stretch_rounds, plan.kept
    state.stretch_rounds = {entry: stretches.get(entry, 0) + 1 if entry in kept else 1 for entry in assignment}
    state.leases_extended += plan.extended
    state.lease_opportunities += plan.opportunities
    state.previous_assignment = assignment
    record_first_runs(state, assignment, now_s, continues_within_s=settings.round_s / 2)
