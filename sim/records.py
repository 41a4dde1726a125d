"""What a round-based run records, from the mechanism's state: a round's record (from its report,
or straight from the plan and the leases) and every job's outcome. Shared by the bus-free path and
the services driver, so both record alike.
"""

from __future__ import annotations

from collections.abc import Sequence

from mechanism_service.core.model import JobState, MechanismState
from mechanism_service.core.reducers import LeaseResult
from mechanism_service.core.rounds import RoundPlan, RoundReport, lease_totals
from sim.results import JobOutcome, RoundRecord


def round_record(report: RoundReport) -> RoundRecord:
    return RoundRecord(
        round_id=report.round_id,
        start_s=report.start_s,
        end_s=report.end_s,
        busy_gpus_by_type=report.busy_gpus_by_type,
        busy_gpu_seconds_by_type=report.busy_gpu_seconds_by_type,
        jobs_running=report.jobs_running,
        jobs_waiting=report.jobs_waiting,
        leases_extended=report.leases_extended,
        lease_opportunities=report.lease_opportunities,
        reset=report.reset,
        leases=report.leases,
    )


def record_round(
    state: MechanismState, round_id: int, start_s: float, plan: RoundPlan, running: Sequence[LeaseResult], reset: bool
) -> RoundRecord:
    """``round_record(round_report(...))`` in one step, without the report in between: the same
    pass over the leases in the same order (the same sums), straight into the record."""
    end_s, busy, busy_s, jobs_running = lease_totals(state, start_s, running)
    return RoundRecord(
        round_id=round_id, start_s=start_s, end_s=end_s, busy_gpus_by_type=busy, busy_gpu_seconds_by_type=busy_s,
        jobs_running=jobs_running, jobs_waiting=plan.jobs_waiting, leases_extended=plan.extended,
        lease_opportunities=plan.opportunities, reset=reset, leases=len(plan.assignment),
    )


def outcomes(state: MechanismState, ended: Sequence[JobState] | None = None) -> tuple[JobOutcome, ...]:
    """Every job's outcome, in admission order. ``ended``: the jobs that completed or failed,
    when the state no longer holds them all (sim/archive.py); else the state's."""
    ended = state.completed if ended is None else ended
    jobs = [*ended, *state.jobs.values()]
    jobs.sort(key=lambda j: j.index)
    retired = {j.index for j in ended}
    return tuple(
        JobOutcome(
            job_id=j.job_id,
            job_type=j.job_type,
            scale_factor=j.scale_factor,
            priority_weight=j.priority_weight,
            total_steps=j.total_steps,
            arrival_s=j.arrival_s,
            start_s=j.first_run_s,
            completion_s=j.last_finish_s if j.steps_remaining <= 0 else None,
            steps_done=j.steps_done,
            gpu_seconds_by_type=dict(j.gpu_seconds_by_type),
            dropped=j.index in retired and j.steps_remaining > 0,
            admitted_s=state.admitted_at_s.get(j.index),
        )
        for j in jobs
    )
