"""A stretch of quiet rounds advanced in one step (sim/quiet.py runs them one at a time).

Once a boundary has run a steady plan (mechanism_service/core/quiet.py), the boundaries after it
are quiet until the first that something reaches: an arrival, a lease that finishes its job,
a reset the allocation is due for. Up to the one before that, every round is the same plan
with the same leases (each a full lease, extended: no restore), so what the loop would do at
each of those boundaries is arithmetic over known values, done here for all of them at once
with the loop's own floats:

- the clock: each boundary is the latest lease's finish plus the boundary's lag, one boundary
  after the other (a running sum, as the loop adds);
- settling: each lease's time (its finish less the round's start) added to its entry's received
  time, its job's GPU time and its type's total in the order settle.py adds them (latest finish
  first: per type that is the round's times in descending order), with np.add.accumulate,
  which adds one element after the other, so every sum is the loop's float;
- planning's writes (core/quiet.replay): the type order's draw, the stretches, the extension
  counts, when each job's run began;
- the round records (the GPU time summed exactly rounded, as rounds.lease_totals sums it).

The last quiet boundary is left to the loop (it may dispatch a job's last lease).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

import numpy as np

from mechanism_service.core.allocation import reset_due
from mechanism_service.core.model import Entry, JobState, MechanismState, Placement
from mechanism_service.core.planning.picking import type_order
from mechanism_service.core.reducers import LeaseResult
from mechanism_service.core.rounds import RoundClock, RoundPlan
from mechanism_service.core.settings import MechanismSettings
from sim.quiet import FullLease, QuietRounds
from sim.quiet_credit import credit_rounds, record_rounds
from sim.results import RoundRecord
from sim.traces import TraceJob

# Fewer boundaries than this are left to the loop: the arrays' set-up costs more than it saves.
MIN_BOUNDARIES = 3


def advance(
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
    """After a boundary at ``now_s`` ran the steady ``plan`` (its leases ``running``): advance
    the quiet boundaries after it but the last, as the loop would; (the last of them's leases,
    its time), or None when fewer than MIN_BOUNDARIES would be advanced."""
    settings = quiet.settings
    jobs = state.jobs
    entries = list(plan.assignment)
    placements = list(plan.assignment.values())
    members = [jobs[entry[0]] for entry in entries]
    fulls = [
        full_lease((job.job_type, job.scale_factor, placement.accelerator_type, 0.0))
        for job, placement in zip(members, placements, strict=True)
    ]
    steps = [full[1] for full in fulls]
    durations_s = [full[2] for full in fulls]
    for lease, entry, step, duration_s in zip(running, entries, steps, durations_s, strict=True):
        if lease.entry != entry or lease.steps != step or lease.finish_s != now_s + duration_s:
            return None  # not the plan's full leases (cannot happen after a steady plan's boundary)
    # boundaries b+1.. stay quiet while every lease leaves its job steps to run
    last = min((job.total_steps - job.steps_done - 1) // step[0] for job, step in zip(members, steps, strict=True))
    longest_s = max(durations_s)
    times_s = [now_s]
    ends_s = [clock.previous_end_s]
    next_arrival_s = arrivals[0].arrival_time_s if arrivals else math.inf
    resolve_at_s = math.inf if state.resolve_at_s is None else state.resolve_at_s
    may_reset = state.needs_allocation
    while len(times_s) <= last:
        end_s = times_s[-1] + longest_s
        t_s = end_s + lag_s
        if next_arrival_s <= t_s or t_s >= resolve_at_s or (may_reset and reset_due(state, t_s, settings)):
            break
        times_s.append(t_s)
        ends_s.append(end_s)
    count = len(times_s) - 2  # the quiet boundaries after now but the last
    if count < MIN_BOUNDARIES:
        return None
    times_s.pop()  # (the last quiet boundary: the loop's)
    ends_s.pop()
    _advance(state, plan, entries, placements, members, steps, durations_s, times_s, ends_s, clock, rounds, settings, shuffle)
    quiet.advanced += count
    quiet.promised = max(0, quiet.promised - count)
    now_s = times_s[-1]
    finishes_s = (np.float64(now_s) + np.array(durations_s)).tolist()
    running = [
        LeaseResult(entry, placement, step, finish_s)
        for entry, placement, step, finish_s in zip(entries, placements, steps, finishes_s, strict=True)
    ]
    return running, now_s


def _advance(
    state: MechanismState, plan: RoundPlan, entries: list[Entry], placements: list[Placement], members: list[JobState],
    steps: list[tuple[int]], durations_s: list[float], times_s: list[float], ends_s: list[float],
    clock: RoundClock, rounds: list[RoundRecord], settings: MechanismSettings, shuffle: Callable[[list[str]], None],
) -> None:
    """Boundaries times_s[1:] (count of them), each settling the round dispatched at the one
    before and running ``plan`` again: the state, the clock and the records as the loop leaves
    them (sim/quiet_credit.py). ``ends_s[i]``: the end of the round before the one dispatched at
    times_s[i] (Gavel's round start)."""
    count = len(times_s) - 1
    t = np.array(times_s)
    finish = t[:, None] + np.array(durations_s)[None, :]  # (count + 1) x leases: each round's finishes
    on = np.array([[p.accelerator_type for p in placements]] * (count + 1))
    gpus = np.array([len(p.worker_ids) for p in placements])
    rounds_steps = np.array([[step[0] for step in steps]] * (count + 1))
    credit_rounds(state, entries, members, on, gpus, t, finish, rounds_steps, ends_s, clock, settings)
    _replay_planning(state, plan, count, settings, shuffle)
    record_rounds(state, on, gpus, t, finish, [plan.extended] * count, rounds)


def _replay_planning(
    state: MechanismState, plan: RoundPlan, count: int, settings: MechanismSettings, shuffle: Callable[[list[str]], None],
) -> None:
    """What planning writes at ``count`` boundaries of a steady plan (core/quiet.replay, each; the
    first runs: sim/quiet_credit.py)."""
    if settings.shuffle_type_order:
        for _ in range(count):
            shuffle(type_order(state, settings))
    stretches = state.stretch_rounds
    state.stretch_rounds = {entry: stretches.get(entry, 0) + count for entry in plan.assignment}
    state.leases_extended += count * plan.extended
    state.lease_opportunities += count * plan.opportunities
