"""A stretch of quiet rounds under a drawn type order advanced in one step (sim/quiet_advance.py
does it for a steady plan; mechanism_service/core/quiet.drawn_plans says when the draw alone
places the jobs).

Under Gavel's mechanism an agnostic policy's rounds differ: each boundary draws the type order,
and when every job can run on every type and every type has room for all of them, every job goes
to the first type drawn (kept where it was, or all moved together). So from one boundary to
the next quiet one the loop's work is the draw, then arithmetic over known values: the leases of
each job on each type are known, and so is whether a round keeps last round's GPUs. Here the
draws are made one boundary after the other, as the loop makes them (the stream stays in step),
and the settling, the records and what planning writes follow for all the boundaries at once,
with the loop's own floats (np.add.accumulate adds one element after another; a round on
another type adds 0.0 to a cell, which changes no float).

A boundary is advanced here only when it is quiet and the lease it dispatches leaves its job steps
to run on any type, so it needs no draw to be decided; the first that is not is the loop's.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

import numpy as np

from mechanism_service.core.allocation import reset_due
from mechanism_service.core.model import Entry, JobState, MechanismState, Placement
from mechanism_service.core.planning.picking import type_order
from mechanism_service.core.quiet import DrawnPlans, drawn_plan
from mechanism_service.core.reducers import LeaseResult
from mechanism_service.core.rounds import RoundClock, RoundPlan
from sim.quiet import FullLease, QuietRounds, SkipMispredicted
from sim.quiet_credit import credit_rounds, record_rounds
from sim.results import RoundRecord
from sim.traces import TraceJob


def advance_drawn(
    quiet: QuietRounds,
    state: MechanismState,
    plan: RoundPlan,
    running: list[LeaseResult],
    clock: RoundClock,
    rounds: list[RoundRecord],
    now_s: float,
    arrivals: deque[TraceJob],
    lag_s: float,
    full_lease: FullLease,
    shuffle: Callable[[list[str]], None],
) -> tuple[list[LeaseResult], float] | None:
    """After a boundary at ``now_s`` ran the drawn ``plan`` (its leases ``running``): advance the
    quiet boundaries after it that need no draw to be decided; (the last one's leases, its time),
    or None when not even the next one can be (nothing drawn, nothing changed)."""
    plans = quiet.drawn
    settings = quiet.settings
    if plans is None or not plans.everywhere or not plan.assignment:
        return None
    entries = list(plan.assignment)
    types = list(state.gpus)
    jobs = [state.jobs[entry[0]] for entry in entries]
    first_type = plan.assignment[entries[0]].accelerator_type
    restore_s = settings.restore_s

    def lease(k: int, w: str, kept: bool) -> tuple[int, float]:
        _, (steps,), duration_s = full_lease((jobs[k].job_type, jobs[k].scale_factor, w, 0.0 if kept else restore_s))
        return steps, duration_s

    # every job's lease on every type, kept or moved: the same while these plans and entries hold
    cached = quiet.drawn_leases
    if cached is not None and cached[0] is plans and cached[1] == entries:
        leases, most_steps = cached[2]
    else:
        leases = {(w, kept): [lease(k, w, kept) for k in range(len(entries))] for w in types for kept in (True, False)}
        most_steps = [max(leases[key][k][0] for key in leases) for k in range(len(entries))]
        quiet.drawn_leases = (plans, entries, (leases, most_steps))
    kept_now = bool(plan.kept)
    this = leases[(first_type, kept_now)]
    for lease_result, entry, (steps, duration_s) in zip(running, entries, this, strict=True):
        if lease_result.entry != entry or lease_result.steps != (steps,) or lease_result.finish_s != now_s + duration_s:
            return None  # not the plan's full leases on one type
    if any(steps < job.scale_factor for key in leases for (steps, _), job in zip(leases[key], jobs, strict=True)):
        return None  # a lease that would fail (settle.py): not quiet
    remaining = [job.total_steps - job.steps_done for job in jobs]
    next_arrival_s = arrivals[0].arrival_time_s if arrivals else math.inf
    resolve_at_s = math.inf if state.resolve_at_s is None else state.resolve_at_s

    rng = getattr(shuffle, "__self__", None)  # Gavel's Mersenne Twister: a draw can be taken back
    peek = rng is not None and hasattr(rng, "getstate") and hasattr(rng, "setstate")

    def quiet_at(t_s: float, left: list[int], steps_now: list[int], most: list[int]) -> bool:
        """Whether the boundary at t_s is quiet (its round's leases ``steps_now``, ``left`` before
        them) and the lease it dispatches is a full one if it runs ``most`` steps."""
        if next_arrival_s <= t_s or t_s >= resolve_at_s or (state.needs_allocation and reset_due(state, t_s, settings)):
            return False
        return all(r - s >= m and r - s > 0 for r, s, m in zip(left, steps_now, most, strict=True))

    # decided before any draw: the next boundary, with the longest leases of all
    longest_s = max(duration_s for key in leases for _, duration_s in leases[key])
    if not quiet_at((now_s + longest_s) + lag_s, remaining, [s for s, _ in this], [0] * len(entries) if peek else most_steps):
        return None
    # the boundaries one after the other, each drawn once it is known to be advanced (or, where a
    # draw can be taken back, drawn and taken back when its leases would not all be full ones)
    times_s, ends_s, kinds = [now_s], [clock.previous_end_s], [(first_type, kept_now)]
    left, steps_now, longest_now_s = list(remaining), [s for s, _ in this], max(d for _, d in this)
    while len(times_s) < 100_000:
        end_s = times_s[-1] + longest_now_s
        t_s = end_s + lag_s
        if not quiet_at(t_s, left, steps_now, [0] * len(entries) if peek else most_steps):
            break
        before = rng.getstate() if peek else None  # type: ignore[union-attr]
        order = type_order(state, settings)
        shuffle(order)  # open_round's draw at this boundary
        kind = (order[0], order[0] == kinds[-1][0])
        after = [r - s for r, s in zip(left, steps_now, strict=True)]
        if any(r < s for r, (s, _) in zip(after, leases[kind], strict=True)):  # a job's last lease: the loop's
            if not peek:  # (without a peek every lease was known full before the draw)
                raise SkipMispredicted("a drawn boundary advanced without planning dispatched a job's last lease")
            rng.setstate(before)  # type: ignore[union-attr]
            break
        left = after
        times_s.append(t_s)
        ends_s.append(end_s)
        kinds.append(kind)
        steps_now = [s for s, _ in leases[kind]]
        longest_now_s = max(d for _, d in leases[kind])
    count = len(times_s) - 1
    if count == 0:
        return None
    assignment = _advance(state, plans, entries, jobs, leases, times_s, ends_s, kinds, clock, rounds, quiet)
    quiet.advanced += count
    now_s = times_s[-1]
    last = leases[kinds[-1]]
    finishes_s = (np.float64(now_s) + np.array([d for _, d in last])).tolist()
    running = [
        LeaseResult(entry, assignment[entry], (steps,), finish_s)
        for entry, (steps, _), finish_s in zip(entries, last, finishes_s, strict=True)
    ]
    return running, now_s


def _advance(
    state: MechanismState, plans: DrawnPlans, entries: list[Entry], jobs: list[JobState],
    leases: dict[tuple[str, bool], list[tuple[int, float]]], times_s: list[float], ends_s: list[float],
    kinds: list[tuple[str, bool]], clock: RoundClock, rounds: list[RoundRecord], quiet: QuietRounds,
) -> dict[Entry, Placement]:
    """Boundaries times_s[1:], each settling the round dispatched at the one before and running its
    drawn plan (``kinds``: each round's type, and whether it kept last round's GPUs): the state, the
    clock and the records as the loop leaves them (sim/quiet_credit.py); the last round's
    assignment."""
    settings = quiet.settings
    count = len(times_s) - 1
    t = np.array(times_s)
    steps = np.array([[s for s, _ in leases[kind]] for kind in kinds])  # (count + 1) x leases
    finish = t[:, None] + np.array([[d for _, d in leases[kind]] for kind in kinds])
    on = np.array([[w] * len(entries) for w, _ in kinds])
    gpus = np.array([job.scale_factor for job in jobs])  # one size, each entry a gang of it
    credit_rounds(state, entries, jobs, on, gpus, t, finish, steps, ends_s, clock, settings)
    # what planning wrote at each boundary (core/quiet.replay): stretches, extensions;
    # after a move every job is on the last round's type, on drawn_plan's lowest free workers
    moves = [i for i, (_, kept) in enumerate(kinds) if i and not kept]
    if moves:
        state.stretch_rounds = dict.fromkeys(entries, count + 1 - moves[-1])
        state.previous_assignment = synthetic_assignment(state, plans, kinds[-1][0])
    else:
        stretches = state.stretch_rounds
        state.stretch_rounds = {entry: stretches.get(entry, 0) + count for entry in entries}
    state.leases_extended += (count - len(moves)) * len(entries)
    state.lease_opportunities += count * len(entries)
    record_rounds(state, on, gpus, t, finish, [len(entries) if kept else 0 for _, kept in kinds[1:]], rounds)
    return state.previous_assignment


def synthetic_assignment(state: MechanismState, plans: DrawnPlans, w: str) -> dict[Entry, Placement]:
    """Every entry moved to ``w`` (no previous placement there): drawn_plan's lowest free workers."""
    previous, state.previous_assignment = state.previous_assignment, {}
    try:
        return drawn_plan(state, plans, [w, *(other for other in state.gpus if other != w)]).assignment
    finally:
        state.previous_assignment = previous
