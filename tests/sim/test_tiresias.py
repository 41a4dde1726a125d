"""Tiresias in the simulator: a job that crosses a queue threshold is preempted though no job
arrives or leaves (the policy's valid_for_s: the mechanism solves again then), and the starvation
guard runs a job that short jobs keep below (both engines agreeing: test_paper_schedulers.py)."""

from __future__ import annotations

import pytest

from mechanism_service.core.settings import preset
from policy_service.service import shipped_context
from sim.fastpath import RunConfig, simulate
from sim.traces import TraceJob

CONTEXT = shipped_context()
CLUSTER = {"v100": 8, "p100": 4, "k80": 4}


@pytest.mark.parametrize("policy", ["tiresias_perf", "srtf_perf"])
def test_a_job_crossing_the_first_threshold_is_preempted_by_a_newer_one(policy):
    # One v100; A arrives at 0, B at 600 s, each 3 hours of work alone. Both start in the highest
    # queue (< 3,600 GPU-s), where A is older: A runs. A crosses 3,600 GPU-s at ~3,600 s; no job
    # arrives or leaves then, yet Tiresias' answer changes: B (0 GPU-s) runs before A is done.
    # SRTF, whose answer changes only with the job set, lets A finish first.
    steps_per_s = CONTEXT.table.isolated("A3C", 1, "v100")
    steps = int(3 * 3600 * steps_per_s)
    trace = [TraceJob("A", "A3C", steps, 1, 0.0), TraceJob("B", "A3C", steps, 1, 600.0)]
    result = simulate(trace, RunConfig(policy, {"v100": 1}, preset("default", policy), seed=0), CONTEXT)
    a, b = sorted(result.jobs, key=lambda j: j.job_id)
    if policy == "srtf_perf":
        assert b.start_s >= a.completion_s
        return
    # (at the first boundary after the crossing, or the next: boundaries drift by the leases' overheads)
    assert 3600.0 <= b.start_s <= 3600.0 + 2 * 360.0
    assert b.start_s < a.completion_s


def test_the_starvation_guard_runs_a_job_that_short_jobs_keep_below():
    # One v100. A (12 h of work) arrives at 0 and runs until it crosses 3,600 GPU-s (queue 1);
    # from 0.5 h a 0.5 h job arrives every 0.5 h for 40 h, so queue 0 always has one waiting and
    # A, alone, would wait until they stop (its service stays at ~3,960 GPU-s through 20 h).
    # Waiting 8 x its last run (~1 h) promotes it: by 20 h it has run again, more than once.
    steps_per_s = CONTEXT.table.isolated("A3C", 1, "v100")
    trace = [TraceJob("A", "A3C", int(12 * 3600 * steps_per_s), 1, 0.0)] + [
        TraceJob(f"s{i}", "A3C", int(1800 * steps_per_s), 1, 1800.0 * (i + 1)) for i in range(80)
    ]
    service_of_a: dict[float, float] = {}

    def observe(state, now_s):
        for job in state.jobs.values():
            if job.job_id == "A":
                service_of_a[now_s] = sum(job.gpu_seconds_by_type.values())

    config = RunConfig("tiresias_perf", {"v100": 1}, preset("default", "tiresias_perf"), seed=0)
    simulate(trace, config, CONTEXT, observe=observe)
    by_20_h = max(v for t, v in service_of_a.items() if t <= 20 * 3600)
    assert by_20_h > 2 * 3600
