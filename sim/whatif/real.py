"""What really happened, from a journal's history, in the simulator's terms (sim/whatif/replay.py
builds the replay beside it): the real run as a ``SimulationResult`` measured by the same code as
the replays (sim/metrics.py), the time its boundaries took after what called for them, and a
result's times from the comparison's time zero. Pure.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from sim.results import JobOutcome, RoundRecord, SimulationResult
from sim.whatif.history import History, JobRecord, LeaseRun


def boundary_lag_s(leases: Sequence[LeaseRun], arrivals_s: Mapping[str, float], from_s: float = -math.inf) -> float | None:
    """The mean time a boundary (from ``from_s`` on) came after what called for it: the end of
    the round before, when it dispatched a job that had arrived by then (work was waiting: it
    closed that round); else the first arrival among the jobs it dispatched (an idle mechanism
    woken by a job). A cold start (a fresh policy process's first solve) counts like any other:
    over a long history it is one boundary among many."""
    ends: dict[float, float] = {}
    dispatched: dict[float, list[str]] = collections.defaultdict(list)
    for lease in leases:
        if lease.reported:
            ends[lease.dispatched_at_s] = max(ends.get(lease.dispatched_at_s, lease.end_s), lease.end_s)
            dispatched[lease.dispatched_at_s].extend(lease.job_ids)
    starts = sorted(ends)
    lags = []
    for before, after in zip([None, *starts], starts):
        if after < from_s:
            continue
        arrived = [arrivals_s[j] for j in dispatched[after] if j in arrivals_s]
        if before is not None and any(a <= ends[before] for a in arrived):
            lags.append(max(0.0, after - ends[before]))
        elif arrived:
            lags.append(max(0.0, after - min(arrived)))
    return sum(lags) / len(lags) if lags else None


def real_result(
    history: History, replayed: Sequence[tuple[JobRecord, int, float]], window: tuple[int, int], names: Mapping[str, str],
    cluster: Mapping[str, int], round_s: float, preset_name: str, origin_s: float,
) -> SimulationResult:
    """The real run as a SimulationResult on the mechanism's clock: the replayed jobs' outcomes
    (measured ones complete, as the real run completed them) and a round per boundary that
    dispatched leases from the origin on."""
    leases = [lease for lease in history.leases if lease.dispatched_at_s >= origin_s and lease.reported]
    by_job: dict[str, list[LeaseRun]] = collections.defaultdict(list)
    for lease in leases:
        for job_id in lease.job_ids:
            by_job[job_id].append(lease)
    outcomes = []
    measured = [j.job_id for j, _, _ in replayed[window[0]:window[1]]]
    for job, steps, arrival_s in replayed:
        runs = by_job.get(job.job_id, [])
        end = history.ends.get(job.job_id)
        gpu_s: dict[str, float] = collections.defaultdict(float)
        done = 0
        for lease in runs:
            gpu_s[lease.accelerator_type] += lease.gpus * lease.elapsed_s
            done += lease.steps[lease.job_ids.index(job.job_id)]
        outcomes.append(JobOutcome(
            job_id=job.job_id, job_type=names[job.job_id], scale_factor=job.scale_factor,
            priority_weight=job.priority_weight, total_steps=steps, arrival_s=arrival_s,
            start_s=min((lease.dispatched_at_s for lease in runs), default=None),
            completion_s=end.completion_s if end is not None and end.outcome == "completed" else None,
            steps_done=min(done, steps), gpu_seconds_by_type=dict(gpu_s),
            dropped=end is not None and end.outcome == "failed",
        ))
    last = max((o for o in outcomes if o.job_id in set(measured)), key=lambda o: o.completion_s or 0.0)
    last_dispatch_s = max(
        (lease.dispatched_at_s for lease in by_job.get(last.job_id, []) if lease.end_s <= (last.completion_s or 0.0) + 1e-9),
        default=last.completion_s or 0.0,
    )
    makespan_s = max((lease.end_s for lease in leases if lease.dispatched_at_s == last_dispatch_s), default=last.completion_s or 0.0)
    return SimulationResult(
        policy=history.last_policy or "unknown", preset=preset_name, cluster=dict(cluster), round_s=round_s, seed=0,
        # the rounds until the one that finished the last measured job, where a replay stops too
        jobs=tuple(outcomes), rounds=_rounds(history, [lease for lease in leases if lease.dispatched_at_s <= last_dispatch_s]),
        makespan_s=max(makespan_s, last.completion_s or 0.0),
        measured_job_ids=tuple(measured), resets=sum(history.policies.values()), solve_times_s=(),
    )


def _rounds(history: History, leases: Sequence[LeaseRun]) -> tuple[RoundRecord, ...]:
    """A round per boundary time, with the jobs in the cluster then (arrived, not yet ended)."""
    arrivals = np.sort(np.array([j.arrival_s for j in history.jobs], dtype=float))
    ended = []
    for j in history.jobs:
        end = history.ends.get(j.job_id)
        if end is not None:
            ended.append(end.completion_s if end.completion_s is not None else end.at_s)
    ended_s = np.sort(np.array(ended, dtype=float))
    by_start: dict[float, list[LeaseRun]] = collections.defaultdict(list)
    for lease in leases:
        by_start[lease.dispatched_at_s].append(lease)
    starts = np.array(sorted(by_start), dtype=float)
    in_system = np.searchsorted(arrivals, starts, side="right") - np.searchsorted(ended_s, starts, side="right")
    rounds = []
    for index, (start_s, present) in enumerate(zip(starts, in_system)):
        group = by_start[float(start_s)]
        busy: dict[str, int] = collections.defaultdict(int)
        busy_s: dict[str, float] = collections.defaultdict(float)
        for lease in group:
            busy[lease.accelerator_type] += lease.gpus
            busy_s[lease.accelerator_type] += lease.gpus * lease.elapsed_s
        running = sum(len(lease.job_ids) for lease in group)
        rounds.append(RoundRecord(
            round_id=index, start_s=float(start_s), end_s=max(lease.end_s for lease in group),
            busy_gpus_by_type=dict(busy), busy_gpu_seconds_by_type=dict(busy_s), jobs_running=running,
            jobs_waiting=max(0, int(present) - running), leases_extended=sum(lease.extended for lease in group),
            lease_opportunities=0, reset=False, leases=len(group),
        ))
    return tuple(rounds)


def shifted(result: SimulationResult, origin_s: float) -> SimulationResult:
    """The same run with ``origin_s`` as time zero (the metrics count utilisation from 0)."""
    if origin_s == 0.0:
        return result

    def at(t: float | None) -> float | None:
        return None if t is None else t - origin_s

    return dataclasses.replace(
        result,
        jobs=tuple(
            dataclasses.replace(j, arrival_s=j.arrival_s - origin_s, start_s=at(j.start_s), completion_s=at(j.completion_s))
            for j in result.jobs
        ),
        rounds=tuple(dataclasses.replace(r, start_s=r.start_s - origin_s, end_s=r.end_s - origin_s) for r in result.rounds),
        makespan_s=result.makespan_s - origin_s,
    )
