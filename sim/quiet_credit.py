"""What a stretch of quiet rounds advanced in one step writes, whatever made its plans (a steady plan:
sim/quiet_advance.py; the type order's draws: sim/quiet_drawn.py): the settling of every round,
the records, the clock, as the loop would leave them, with the loop's own floats.

Each round's leases are given as arrays, a row a round, a column an entry (``on``: the type each
lease ran on). np.add.accumulate adds one element after another, so every running sum is the
loop's float; a cell credited on a round its entry ran elsewhere adds 0.0, which changes no float
(the sums are of times >= 0); per type, a round's times are added in descending order, settle.py's
order (latest finish first).
"""

from __future__ import annotations

import math

import numpy as np

from mechanism_service.core.model import Entry, JobState, MechanismState
from mechanism_service.core.rounds import RoundClock
from mechanism_service.core.settings import MechanismSettings
from sim.results import RoundRecord


def credit_rounds(
    state: MechanismState, entries: list[Entry], jobs: list[JobState], on: np.ndarray, gpus: np.ndarray,
    t: np.ndarray, finish: np.ndarray, steps: np.ndarray, ends_s: list[float], clock: RoundClock,
    settings: MechanismSettings,
) -> None:
    """Settle the rounds dispatched at t[:-1] (leases ending at ``finish``, running ``steps`` on the
    types ``on``), each at the boundary after it (t[1:]): received time, each type's total, each
    job's GPU time, steps and last finish; when each job's run began (record_first_runs); the
    clock. ``ends_s[i]``: the end of the round before the one dispatched at t[i] (Gavel's round
    start)."""
    count = len(t) - 1
    starts = np.array(ends_s[:count]) if settings.round_start_from_previous_end else t[:count]
    ran_s = finish[:count] - starts[:, None]  # what settle credits: finish - the round's start
    ledgers = state.entries
    rows = np.array([ledgers.row_of[entry] for entry in entries])
    for w in sorted(set(on[:count].ravel().tolist())):
        mask = on[:count] == w
        ran_here = mask.any(axis=0)
        credited = np.where(mask, ran_s, 0.0)[:, ran_here]
        here = rows[ran_here]
        column = ledgers.column_of[w]
        first = ledgers.received_s[here, column]
        ledgers.received_s[here, column] = np.add.accumulate(np.vstack((first, credited)), axis=0)[-1]
        descending = -np.sort(-credited, axis=1)
        state.type_time_s[w] = float(np.add.accumulate(np.concatenate(([state.type_time_s[w]], descending.ravel())))[-1])
        members = [job for job, ran in zip(jobs, ran_here.tolist(), strict=True) if ran]
        before = np.array([job.gpu_seconds_by_type.get(w, 0.0) for job in members])
        after = np.add.accumulate(np.vstack((before, credited * gpus[ran_here][None, :])), axis=0)[-1].tolist()
        for job, gpu_seconds in zip(members, after, strict=True):
            job.gpu_seconds_by_type[w] = gpu_seconds
    for job, steps_done, finish_s in zip(jobs, steps[:count].sum(axis=0).tolist(), finish[count - 1].tolist(), strict=True):
        job.steps_done += steps_done
        job.last_finish_s = finish_s
        job.failures = 0
    # record_first_runs: a run that did not continue (its last lease ended over half a round
    # before the boundary) starts again there
    restarted = (t[1:, None] - finish[:count]) > settings.round_s / 2
    if restarted.any():
        for k in np.flatnonzero(restarted.any(axis=0)).tolist():
            state.run_started_s[jobs[k].index] = float(t[1 + int(np.flatnonzero(restarted[:, k])[-1])])
    clock.previous_end_s = ends_s[-1]  # RoundClock.close at the last boundary: that round's end
    clock.start_s = float(starts[-1])
    clock.dispatched_at_s = float(t[-1])


def record_rounds(
    state: MechanismState, on: np.ndarray, gpus: np.ndarray, t: np.ndarray, finish: np.ndarray,
    extended: list[int], rounds: list[RoundRecord],
) -> None:
    """The records of the rounds dispatched at t[1:] (``extended``: each one's extensions), as
    record_round makes them (rounds.lease_totals: the GPU time summed exactly rounded)."""
    run_s = ((finish[1:] - t[1:, None]) * gpus[None, :]).tolist()  # gpus x (finish - start)
    last_finish_s = finish[1:].max(axis=1).tolist()
    leases = len(gpus)
    for i, (types, row_s) in enumerate(zip(on[1:].tolist(), run_s, strict=True)):
        busy = dict.fromkeys(state.gpus, 0)
        terms: dict[str, list[float]] = {w: [] for w in state.gpus}
        for w, g, run in zip(types, gpus.tolist(), row_s, strict=True):
            busy[w] += g
            terms[w].append(run)
        start_s = float(t[i + 1])
        rounds.append(RoundRecord(
            round_id=len(rounds), start_s=start_s, end_s=max(start_s, last_finish_s[i]), busy_gpus_by_type=busy,
            busy_gpu_seconds_by_type={w: math.fsum(v) for w, v in terms.items()}, jobs_running=leases, jobs_waiting=0,
            leases_extended=extended[i], lease_opportunities=leases, reset=False, leases=leases,
        ))
