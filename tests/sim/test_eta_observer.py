"""The fast path's ``observe`` hook (what bench/eta_accuracy.py reads the ETA through) changes
nothing of the schedule, and the ETA's soonest bound holds against real completions (the rates
are the table's: no job can finish before it would alone on its fastest type all the time)."""

from __future__ import annotations

from mechanism_service.core.eta import job_eta
from mechanism_service.core.model import MechanismState
from mechanism_service.core.settings import preset
from policy_service.service import shipped_context
from sim.fastpath import RunConfig, simulate
from sim.traces import TraceSpec, TraceStreams, generate_trace

CONTEXT = shipped_context()


def test_observing_the_state_changes_no_schedule_and_no_job_beats_its_soonest_bound():
    assert CONTEXT.table is not None
    trace = generate_trace(TraceSpec(num_jobs=40, jobs_per_hour=6.0), CONTEXT.table, TraceStreams.gavel(3))
    config = RunConfig("max_min_fairness_perf", {"v100": 2, "p100": 2, "k80": 2}, preset("default", "max_min_fairness_perf"), seed=3)
    first: dict[str, tuple[float, float | None]] = {}  # job -> (ETA, soonest) at its first boundary with one

    def observe(state: MechanismState, now_s: float) -> None:
        for job in state.jobs.values():
            if job.job_id not in first:
                eta = job_eta(state, job, now_s)
                if eta.finish_s is not None:
                    first[job.job_id] = (eta.finish_s, eta.soonest_s)

    observed = simulate(trace, config, CONTEXT, observe=observe)
    plain = simulate(trace, config, CONTEXT)
    assert observed.jobs == plain.jobs and observed.rounds == plain.rounds
    completed = [j for j in observed.jobs if j.completion_s is not None]
    assert len(completed) == len(trace) and set(first) == {j.job_id for j in completed}
    for job in completed:
        _, soonest_s = first[job.job_id]
        assert soonest_s is not None and job.completion_s >= soonest_s  # type: ignore[operator]
