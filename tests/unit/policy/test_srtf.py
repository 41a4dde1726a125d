"""SRTF (shortest remaining time first), checked by hand on four jobs and a 1 v100 + 2 k80 cluster."""

from __future__ import annotations

import numpy as np
import pytest

from policy_service.core import JobSpec, build_problem, make_policy
from policy_service.core.srtf import remaining_time_s
from tests.unit.policy.builders import assert_feasible

# (id, steps remaining, v100 steps/s, k80 steps/s, seconds since arrival)
#   remaining time alone:            on the fastest type      on the v100 (agnostic)
#   A: 1000 / 10 = 100 s (v100)      100 s
#   B:  600 /  3 = 200 s (v100)      200 s
#   C:  300 /  6 =  50 s (k80: the job runs 6x faster there)    300 / 1 = 300 s
#   D:  800 /  4 = 200 s (v100)      200 s, a tie with B: D arrived first (30 s ago, B 10 s)
JOBS = [("A", 1000, 10.0, 2.0, 20.0), ("B", 600, 3.0, 2.0, 10.0), ("C", 300, 1.0, 6.0, 5.0), ("D", 800, 4.0, 1.0, 30.0)]


def _problem():
    jobs = [
        JobSpec(id=name, steps_remaining=steps, time_since_arrival_s=waited,
                throughputs_steps_per_s={"v100": v100, "k80": k80})
        for name, steps, v100, k80, waited in JOBS
    ]
    return build_problem({"v100": 1, "k80": 2}, jobs)


def test_remaining_times_by_hand() -> None:
    problem = _problem()
    assert remaining_time_s(problem, True).tolist() == [100.0, 200.0, 50.0, 200.0]
    assert remaining_time_s(problem, False).tolist() == [100.0, 200.0, 300.0, 200.0]


def test_srtf_perf_runs_the_shortest_jobs_each_on_its_fastest_free_type() -> None:
    problem = _problem()
    allocation = make_policy("srtf_perf").allocate(problem)
    # Order C (50 s), A (100 s), D (200 s, older), B (200 s).
    # C takes a k80 (6 > 1 steps/s); A the v100; D would rather the v100, full: the second k80;
    # B finds no GPU left and waits.
    assert allocation.job_fractions.tolist() == [[1.0, 0.0], [0.0, 0.0], [0.0, 1.0], [0.0, 1.0]]
    assert allocation.policy == "srtf_perf" and allocation.status == "optimal"
    assert_feasible(problem, allocation)


@pytest.mark.parametrize("seed", range(5))
def test_agnostic_srtf_ranks_by_v100_time_and_places_anywhere(seed: int) -> None:
    problem = _problem()
    allocation = make_policy("srtf", rng=np.random.default_rng(seed)).allocate(problem)
    # Order by v100 time: A (100 s), D (200 s, older), B (200 s), C (300 s): three GPUs, so A, D
    # and B run (on whichever types the draw gives) and C, fastest of all on a k80, waits.
    assert allocation.job_fractions.sum(axis=1).tolist() == [1.0, 1.0, 0.0, 1.0]
    assert allocation.job_fractions.sum(axis=0).tolist() == [1.0, 2.0]
    assert_feasible(problem, allocation)


def test_a_gang_that_does_not_fit_is_skipped_and_smaller_jobs_behind_it_run() -> None:
    # Two v100s. small1: 5 s left; big (2 GPUs): 10 s; small2: 20 s. small1 takes one v100, big
    # needs two and is skipped, small2 takes the other (FIFO would stop at big).
    jobs = [
        JobSpec(id="big", steps_remaining=10, scale_factor=2, throughputs_steps_per_s={"v100": 1.0}),
        JobSpec(id="small1", steps_remaining=5, throughputs_steps_per_s={"v100": 1.0}),
        JobSpec(id="small2", steps_remaining=20, throughputs_steps_per_s={"v100": 1.0}),
    ]
    problem = build_problem({"v100": 2}, jobs)
    allocation = make_policy("srtf_perf").allocate(problem)
    assert allocation.job_fractions.tolist() == [[0.0], [1.0], [1.0]]


def test_priority_weight_divides_the_remaining_time() -> None:
    # One v100: "long" has 300 s left but weight 4 (75 s weighted), "short" 100 s at weight 1.
    jobs = [
        JobSpec(id="short", steps_remaining=100, throughputs_steps_per_s={"v100": 1.0}),
        JobSpec(id="long", steps_remaining=300, priority_weight=4.0, throughputs_steps_per_s={"v100": 1.0}),
    ]
    allocation = make_policy("srtf_perf").allocate(build_problem({"v100": 1}, jobs))
    assert allocation.job_fractions.tolist() == [[0.0], [1.0]]
