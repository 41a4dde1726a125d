"""``gavel simulate --ideal``: the fluid run of a policy (Gavel's ``ideal``, re-solved at every
event): its allocation realised exactly, with no rounds.

Every job progresses continuously at sum over types w of x[w] x T[w] steps/s (its allocation's
share of time on w times its steps/s there, alone or in its packed pair), from the moment the
policy gives it a share; the policy is solved again at every arrival and every completion (Gavel's
ideal mode solves at arrivals only and credits the steps at the next one), and when an answer says
it holds only so long (``valid_for_s``: Tiresias's queue thresholds; at most once a simulated
minute). Nothing is lost to what a
real cluster pays for: no integer placement (a job holds 0.37 of a V100 if the LP says so), no
wait for a round boundary, no idle GPU after a job ends mid-round, no restore after a move.

That makes the run a reference for the round-based runs of the same policy on the same trace:
on average they stay above it (docs/simulator.md, "The fluid bound", says when and why; it is not a
per-job bound: time slicing finishes some jobs before processor sharing does).

The loop is a shell over the policy (policy_service.answer.answer, the same call the policy
service makes); the time steps and the progress are arrays, one entry per active job.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from common.messages import (
    AllocationComputed,
    AllocationEntry,
    AllocationRequested,
    PolicyJob,
    PolicyProblem,
)
from common.throughputs import ThroughputTable
from policy_service.answer import SolveContext, answer
from sim.clock import SimulationStalled
from sim.fastpath import Progress, RunConfig, check_inputs, measured_ids
from sim.physics import true_rates
from sim.results import JobOutcome, RoundRecord, SimulationResult
from sim.traces import TraceJob

DONE_STEPS = 1e-6  # a job with fewer steps left than this is done (float progress)
MIN_HOLD_S = 60.0  # the shortest time an answer that expires is kept before solving again


@dataclass(slots=True)
class _Job:
    """One job's fluid progress (mutable: the loop's own bookkeeping, never shared)."""

    trace: TraceJob
    index: int
    remaining_steps: float
    start_s: float | None = None
    completion_s: float | None = None
    isolated_time_s: float = 0.0  # finish-time fairness: time its done steps would take on its isolated share
    remaining_at_last_solve: float | None = None
    isolated_rate_at_last_solve: float = 0.0
    run_started_s: float | None = None  # its current (or last) continuous run began, as the mechanism keeps it
    last_finish_s: float | None = None  # the end of the last interval it ran in
    gpu_seconds_by_type: dict[str, float] = field(default_factory=dict)


def simulate_ideal(
    trace: Sequence[TraceJob], config: RunConfig, context: SolveContext, *, progress: Progress | None = None
) -> SimulationResult:
    """The fluid run of ``config.policy`` over ``trace`` (the result's rounds are the intervals
    between events: their busy GPU-seconds are the allocation's, so utilisation reads the same)."""
    table = check_inputs(trace, context)
    started_wall = time.perf_counter()
    settings = config.settings
    arrivals = sorted(range(len(trace)), key=lambda i: trace[i].arrival_time_s)  # stable: file order on ties
    jobs = [_Job(job, i, float(job.total_steps)) for i, job in enumerate(trace)]
    measured = measured_ids(trace, config.window)
    waiting_for = set(measured)
    types = list(config.cluster)
    active: list[_Job] = []
    intervals: list[RoundRecord] = []
    solve_times: list[float] = []
    policy_state, previous = "", ()
    next_arrival = completed = 0
    now_s = trace[arrivals[0]].arrival_time_s
    while waiting_for if config.window is not None else (next_arrival < len(arrivals) or active):
        # 1. admit what has arrived by now; an empty cluster waits for the next arrival
        while next_arrival < len(arrivals) and trace[arrivals[next_arrival]].arrival_time_s <= now_s:
            active.append(jobs[arrivals[next_arrival]])
            next_arrival += 1
        if not active:
            now_s = trace[arrivals[next_arrival]].arrival_time_s
            continue
        # 2. solve the policy for the jobs here (every event changes the set)
        reply = _solve(active, now_s, config, context, policy_state, previous, len(solve_times))
        solve_times.append(reply.solve_time_s)
        # an answer that holds only so long (Tiresias: a job crossing a queue's threshold) is solved again
        # then, but not sooner than MIN_HOLD_S: least-attained-service sharing is processor sharing in the
        # fluid limit, whose answers would hold for ever shorter times (a starvation guard of a run of 1 s)
        valid_for_s = max(reply.valid_for_s, MIN_HOLD_S) if reply.valid_for_s is not None else math.inf
        policy_state, previous = reply.policy_state, reply.entries
        rates, gpu_shares = _rates(active, reply.entries, table, types)
        # 3. the next event: an arrival, or the first job to finish at its rate
        remaining = np.array([j.remaining_steps for j in active])
        with np.errstate(divide="ignore"):
            finish_in_s = np.where(rates > 0, remaining / np.where(rates > 0, rates, 1.0), math.inf)
        arrival_in_s = trace[arrivals[next_arrival]].arrival_time_s - now_s if next_arrival < len(arrivals) else math.inf
        step_s = min(float(finish_in_s.min(initial=math.inf)), arrival_in_s, valid_for_s)
        if not math.isfinite(step_s):
            stuck = ", ".join(j.trace.job_id for j in active[:5])
            raise SimulationStalled(f"t={now_s:.1f} s: jobs {stuck} get no share of any GPU and no job will arrive")
        # 4. progress at those rates until then; the jobs that reach their end are done
        end_s = now_s + step_s
        done = remaining - rates * step_s <= DONE_STEPS
        done |= finish_in_s <= step_s  # the job that defines the step, exactly
        for i, job in enumerate(active):
            if rates[i] > 0:
                if job.start_s is None:
                    job.start_s = now_s
                if job.last_finish_s is None or job.last_finish_s < now_s:  # a new continuous run
                    job.run_started_s = now_s
                job.last_finish_s = end_s
            job.remaining_steps = 0.0 if done[i] else float(remaining[i] - rates[i] * step_s)
            for w, share in zip(types, gpu_shares[i], strict=True):
                if share > 0:
                    job.gpu_seconds_by_type[w] = job.gpu_seconds_by_type.get(w, 0.0) + share * step_s
            if done[i]:
                job.completion_s = end_s
                waiting_for.discard(job.trace.job_id)
        busy = gpu_shares.sum(axis=0)
        intervals.append(RoundRecord(
            round_id=len(intervals), start_s=now_s, end_s=end_s,
            busy_gpus_by_type={w: math.ceil(b - 1e-9) for w, b in zip(types, busy, strict=True)},
            busy_gpu_seconds_by_type={w: float(b * step_s) for w, b in zip(types, busy, strict=True)},
            jobs_running=int((rates > 0).sum()), jobs_waiting=int((rates <= 0).sum()),
            leases_extended=0, lease_opportunities=0, reset=True, leases=0,
        ))
        active = [job for i, job in enumerate(active) if not done[i]]
        now_s = end_s
        completed += int(done.sum())
        if progress is not None:
            progress(now_s, completed, len(trace))
    return SimulationResult(
        policy=config.policy, preset=settings.preset, cluster=dict(config.cluster), round_s=0.0, seed=config.seed,
        jobs=tuple(_outcome(j) for j in jobs if j.trace.arrival_time_s <= now_s),
        rounds=tuple(intervals), makespan_s=now_s, measured_job_ids=tuple(measured), resets=len(solve_times),
        solve_times_s=tuple(solve_times), wall_s=time.perf_counter() - started_wall,
    )


def _solve(
    active: Sequence[_Job], now_s: float, config: RunConfig, context: SolveContext, policy_state: str,
    previous: tuple[AllocationEntry, ...], solves: int,
) -> AllocationComputed:
    """The policy's allocation for the active jobs, as the policy service answers it; finish-time
    fairness's isolated time advanced first, as the mechanism does at a reset."""
    for job in active:
        if job.isolated_rate_at_last_solve and job.remaining_at_last_solve is not None:
            job.isolated_time_s += (job.remaining_at_last_solve - job.remaining_steps) / job.isolated_rate_at_last_solve
        job.remaining_at_last_solve = job.remaining_steps
    settings = config.settings
    here = {j.trace.job_id for j in active}
    request = AllocationRequested(
        request_id=f"ideal-{solves}",
        policy=config.policy,
        problem=PolicyProblem(
            worker_types=dict(config.cluster),
            jobs=tuple(
                PolicyJob(
                    job_id=j.trace.job_id, job_type=j.trace.job_type, scale_factor=j.trace.scale_factor,
                    priority_weight=j.trace.priority_weight, steps_remaining=max(1, math.ceil(j.remaining_steps)),
                    time_since_arrival_s=now_s - j.trace.arrival_time_s, slo_s=j.trace.slo_s,
                    isolated_time_s=j.isolated_time_s,
                    # what it has run, as the mechanism reports it (least-attained-service policies)
                    attained_service_gpu_s=float(sum(j.gpu_seconds_by_type.values())),
                    time_since_last_run_s=now_s - (j.trace.arrival_time_s if j.last_finish_s is None else j.last_finish_s),
                    last_run_s=(
                        j.last_finish_s - j.run_started_s
                        if j.last_finish_s is not None and j.run_started_s is not None else 0.0
                    ),
                )
                for j in active
            ),
            pairs=None if settings.packing else (),
            previous=tuple(e for e in previous if all(i in here for i in e.job_ids)),
        ),
        deadline_s=math.inf,
        solver=config.solver,
        preset=settings.preset,
        seed=config.seed if settings.preset == "gavel" else config.seed + solves,
        policy_state=policy_state,
    )
    reply = answer(request, context)
    if not isinstance(reply, AllocationComputed):
        raise SimulationStalled(f"t={now_s:.1f} s: the policy failed: {reply.reason}")
    isolated = reply.isolated_throughputs_steps_per_s or {}
    for job in active:
        job.isolated_rate_at_last_solve = isolated.get(job.trace.job_id, 0.0)
    return reply


def _rates(
    active: Sequence[_Job], entries: Sequence[AllocationEntry], table: ThroughputTable, types: Sequence[str]
) -> tuple[np.ndarray, np.ndarray]:
    """(steps/s per active job, GPUs it holds on average per type: shape jobs x types): each entry's
    share of time on a type times the members' true steps/s there (a pair's, for a packed entry),
    and its gang's GPUs times that share (a pair shares one gang's GPUs)."""
    position = {j.trace.job_id: i for i, j in enumerate(active)}
    rates = np.zeros(len(active))
    shares = np.zeros((len(active), len(types)))
    column = {w: k for k, w in enumerate(types)}
    for entry in entries:
        members = [active[position[i]] for i in entry.job_ids if i in position]
        if len(members) != len(entry.job_ids):
            continue
        scale_factor = members[0].trace.scale_factor
        for w, share in entry.fractions.items():
            if share <= 0 or w not in column:
                continue
            member_rates = true_rates(table, [m.trace.job_type for m in members], scale_factor, w)
            for member, rate in zip(members, member_rates, strict=True):
                rates[position[member.trace.job_id]] += share * rate
                shares[position[member.trace.job_id], column[w]] += share * scale_factor / len(members)
    return rates, shares


def _outcome(job: _Job) -> JobOutcome:
    total = job.trace.total_steps
    return JobOutcome(
        job_id=job.trace.job_id, job_type=job.trace.job_type, scale_factor=job.trace.scale_factor,
        priority_weight=job.trace.priority_weight, total_steps=total, arrival_s=job.trace.arrival_time_s,
        start_s=job.start_s, completion_s=job.completion_s,
        steps_done=total if job.completion_s is not None else int(total - job.remaining_steps),
        gpu_seconds_by_type=dict(job.gpu_seconds_by_type),
    )
