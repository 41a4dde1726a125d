"""A sweep's cell with a window and no --jobs generates jobs as Gavel's sweep does, until the
window's jobs finish (sim/sweep_jobs.py, sim/sweep_cells.py run_cell): its figures are those of
a trace long enough, it grows a trace that ran out, a saturated rate is recorded as Gavel records a
run its timeout stops, and on
Gavel's calibration point it is Gavel's run."""

from __future__ import annotations

import json

import pytest

from policy_service.service import shipped_context
from sim.sweep_cells import SweepSpec, run_cell, table_digest
from sim.sweep_jobs import (
    covers,
    first_size,
    jobs_arrived,
    measured_jobs,
    saturated_note,
    sizes,
)
from sim.traces import read_trace
from tests.support.data import REFERENCE

CONTEXTS = {table_digest(None): shipped_context()}
SMALL = {"v100": 2, "p100": 2, "k80": 2}
LONG_JOBS = json.dumps({"fixed_run_time_s": 600 * 3600.0})  # every job 600 h alone on a V100


def cell(num_jobs: int, cluster, window, rate: float, seed: int, policy="max_min_fairness_perf", **spec):
    return run_cell(SweepSpec(num_jobs, False, cluster, table_digest(None), window=window, **spec).cell(policy, rate, seed), CONTEXTS, "local")  # type: ignore[arg-type]


def test_the_sizes_tried_start_past_the_window_by_a_long_jobs_worth_of_arrivals_and_double():
    # Gavel's README point (-s 4000 -e 5000 at 1 job/hour) draws ~5,100 jobs: the first trace holds them
    assert sizes(5000, 1.0) == (10_000, 20_000, 40_000)
    # a small window at a high rate: 168 hours of arrivals past its last job
    assert first_size(3, 0.5) == 3 + 84
    assert measured_jobs((4000, 5000)) == "jobs 4000-4999" and measured_jobs((7, 8)) == "job 7" and measured_jobs(None) == "every job"


def test_a_trace_covers_a_run_that_stopped_before_its_last_job_arrived():
    arrivals_s = [0.0, 10.0, 20.0]
    assert jobs_arrived(arrivals_s, 10.0) == 2 and covers(3, 2)
    assert jobs_arrived(arrivals_s, 20.0) == 3 and not covers(3, 3)  # Gavel's 4th job might have come in time


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_cell_on_demand_has_the_figures_of_a_trace_long_enough(seed):
    on_demand = cell(0, SMALL, (2, 6), 0.05, seed)
    long_enough = cell(200, SMALL, (2, 6), 0.05, seed)
    assert on_demand.error == long_enough.error == ""
    assert (on_demand.avg_jct_s, on_demand.cluster_utilization, on_demand.jobs_completed, on_demand.jobs_arrived) == (
        long_enough.avg_jct_s, long_enough.cluster_utilization, long_enough.jobs_completed, long_enough.jobs_arrived,
    )
    assert on_demand.jobs_completed == 4 and on_demand.jobs_arrived < first_size(6, 0.05)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_trace_that_ran_out_grows_until_it_covers_the_run(seed):
    # job 0 runs 600 h; jobs arrive every ~100 h; the first trace (3 jobs) has all arrived long before
    on_demand = cell(0, {"v100": 8}, (0, 1), 0.01, seed, trace_json=LONG_JOBS)
    long_enough = cell(200, {"v100": 8}, (0, 1), 0.01, seed, trace_json=LONG_JOBS)
    assert on_demand.error == ""
    assert sizes(1, 0.01)[0] == 3 < on_demand.jobs_arrived
    assert (on_demand.avg_jct_s, on_demand.jobs_arrived) == (long_enough.avg_jct_s, long_enough.jobs_arrived)


@pytest.mark.slow  # ~2-5 s: three runs of 169, 338 and 676 hours of arrivals, each stopped at its last one
def test_a_saturated_rate_is_a_result_as_gavels_timed_out_run_is():
    # one GPU, a job an hour, each ~17 h on average: job 0 shares the GPU with ever more jobs
    result = cell(0, {"v100": 1}, (0, 1), 1.0, 0, round_s=3600.0)
    assert result.error == "" and result.saturated and result.jobs_arrived == sizes(1, 1.0)[-1] == 676
    assert saturated_note(result.jobs_arrived, 1.0, (0, 1)) == (
        "job 0 had not finished when all 676 jobs of the largest trace tried had arrived: at 1 jobs/hour the cluster "
        "is saturated, and Gavel's run would not end either (its sweeps' -t stops such runs and record an infinite "
        "JCT); leave this rate out (--cutoffs), or give --jobs N to measure a trace of N jobs"
    )


@pytest.mark.slow  # ~2-5 s: Gavel's 1,200-job calibration point, its 200 measured jobs
def test_on_gavels_calibration_point_the_cell_is_gavels_run():
    """Gavel ran -s 100 -e 300 at 1.4 jobs/hour with seed 1 on 8:8:8 (tests/data/gavel-reference);
    fifo_perf draws nothing and solves no LP, so its figures match to the millisecond."""
    experiment = json.loads((REFERENCE / "results.json").read_text())["experiments"]["continuous_rate1.4_n1200_seed1"]
    recorded = experiment["policies"]["fifo_perf"]
    result = cell(0, {"v100": 8, "p100": 8, "k80": 8}, (100, 300), 1.4, 1, "fifo_perf", preset="gavel")
    assert result.error == ""
    assert result.avg_jct_s == pytest.approx(recorded["avg_jct_s"], abs=0.001)
    assert round(result.cluster_utilization, 3) == recorded["cluster_utilization"]
    # as many jobs arrived as had in Gavel's run when it stopped
    trace = read_trace(REFERENCE / experiment["trace_file"])
    assert result.jobs_arrived == sum(job.arrival_time_s <= recorded["makespan_s"] for job in trace)
