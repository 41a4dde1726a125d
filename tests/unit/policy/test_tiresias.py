"""Tiresias (discretised 2D-LAS), checked by hand on five jobs and a 1 v100 + 2 k80 cluster, with
queues split at 100 and 1,000 GPU-seconds and a starvation limit of 2."""

from __future__ import annotations

import json

import numpy as np
import pytest

from common.errors import PolicyParameterError, ProblemError
from policy_service.core import JobSpec, build_problem, make_policy
from policy_service.core.io_json import problem_from_json, problem_to_json
from tests.unit.policy.builders import assert_feasible

THRESHOLDS = (100.0, 1000.0)

# (id, scale factor, v100 / k80 steps/s, arrived s ago, attained GPU-s, since last run s, last run s)
#   A: 1 GPU,    50 GPU-s -> queue 0; arrived 10 s ago
#   B: 1 GPU,   500 GPU-s -> queue 1; arrived 40 s ago
#   C: 2 GPUs, 2000 GPU-s -> queue 2 (1000 s on 2 GPUs); its last run 100 s, waiting 300 s:
#      300 >= 2 x 100, so it is promoted to queue 0 (counted from 2000 GPU-s from now on)
#   D: 1 GPU,     0 GPU-s -> queue 0, never ran; arrived 5 s ago (the newest)
#   E: 1 GPU,   200 GPU-s -> queue 1; arrived 50 s ago (the oldest of queue 1); waiting 100 s
#      after a 60 s run: 100 < 2 x 60, not promoted
JOBS = [
    ("A", 1, 10.0, 2.0, 10.0, 50.0, 0.0, 50.0),
    ("B", 1, 3.0, 2.0, 40.0, 500.0, 0.0, 500.0),
    ("C", 2, 4.0, 1.0, 30.0, 2000.0, 300.0, 100.0),
    ("D", 1, 1.0, 6.0, 5.0, 0.0, 5.0, 0.0),
    ("E", 1, 5.0, 4.0, 50.0, 200.0, 100.0, 60.0),
]


def _problem(cluster=None, policy_state=None, jobs=JOBS):
    specs = [
        JobSpec(
            id=name, steps_remaining=1000, scale_factor=sf, time_since_arrival_s=arrived,
            throughputs_steps_per_s={"v100": v100, "k80": k80}, attained_service_gpu_s=attained,
            time_since_last_run_s=since, last_run_s=last,
        )
        for name, sf, v100, k80, arrived, attained, since, last in jobs
    ]
    return build_problem(cluster or {"v100": 1, "k80": 2}, specs, policy_state=policy_state)


def _policy(name="tiresias_perf", **params):
    return make_policy(name, thresholds_gpu_s=THRESHOLDS, starve_limit=2.0, **params)


def test_queues_then_first_come_first_served_the_starving_gang_promoted() -> None:
    problem = _problem({"v100": 2, "k80": 2})
    allocation = _policy().allocate(problem)
    # Queue 0 in arrival order: C (30 s ago, promoted), A (10 s), D (5 s); then queue 1: E, B.
    # C (2 GPUs) takes both v100s (4 > 1 steps/s); A the first k80; D the second; E and B wait.
    assert allocation.job_fractions.tolist() == [[0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]
    assert json.loads(allocation.policy_state) == {"promoted_at_gpu_s": {"C": 2000.0}}
    # Soonest change: A crosses 100 GPU-s after 50 s on 1 GPU (C: 100 GPU-s after 50 s on 2 GPUs, a
    # tie; D after 100 s); E (queue 1) starves at 2 x 60 - 100 = 20 s: the answer holds 20 s.
    assert allocation.valid_for_s == pytest.approx(20.0)
    assert_feasible(problem, allocation)


def test_without_the_promotion_the_gang_waits_behind_the_lower_queues() -> None:
    # C's wait (300 s) is under 2 x its last run when the limit is 4 (400 s): it stays in queue 2.
    problem = _problem({"v100": 2, "k80": 2})
    allocation = make_policy("tiresias_perf", thresholds_gpu_s=THRESHOLDS, starve_limit=4.0).allocate(problem)
    # A takes a v100 (10 > 2), D a k80 (6 > 1), E the other v100 (5 > 4), B the last k80; C waits.
    assert allocation.job_fractions.tolist() == [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 1.0], [1.0, 0.0]]
    assert allocation.policy_state is None
    # C starves at 4 x 100 - 300 = 100 s; A crosses after 50 s: 50 s.
    assert allocation.valid_for_s == pytest.approx(50.0)


def test_a_promotion_is_kept_and_the_job_demoted_again_by_what_it_runs_after() -> None:
    # C was promoted at 2000 GPU-s and has run 60 s on 2 GPUs since (2120 GPU-s): 120 GPU-s since
    # the promotion, past the first threshold: queue 1, where it is older than E and B.
    jobs = [row for row in JOBS if row[0] != "C"] + [("C", 2, 4.0, 1.0, 30.0, 2120.0, 0.0, 60.0)]
    state = json.dumps({"promoted_at_gpu_s": {"C": 2000.0, "gone": 5.0}})
    problem = _problem({"v100": 2, "k80": 3}, policy_state=state, jobs=jobs)
    allocation = _policy().allocate(problem)
    # Queue 0: A, D; queue 1 by arrival: E (50 s), B (40 s), C (30 s). A v100, D k80, E v100,
    # B k80; C's gang needs 2 GPUs of one type, one k80 is left: it waits.
    assert allocation.job_fractions.tolist() == [[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [1.0, 0.0], [0.0, 0.0]]
    # The promotion of a job still here is kept, that of a job gone forgotten.
    assert json.loads(allocation.policy_state) == {"promoted_at_gpu_s": {"C": 2000.0}}


@pytest.mark.parametrize("seed", range(3))
def test_agnostic_tiresias_keeps_the_order_and_places_anywhere(seed: int) -> None:
    problem = _problem()
    allocation = _policy("tiresias", rng=np.random.default_rng(seed)).allocate(problem)
    # The order is C (promoted), A, D, E, B, whatever the draw. C's gang of 2 fits only the two
    # k80s and takes them; A takes the v100, the one GPU left; D, E and B wait.
    assert allocation.job_fractions.tolist() == [[1.0, 0.0], [0.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
    assert_feasible(problem, allocation)


def test_a_weight_divides_the_service() -> None:
    # One v100; "heavy" has 300 GPU-s at weight 4 (75: queue 0), "light" 150 GPU-s (queue 1).
    jobs = [
        JobSpec(id="light", steps_remaining=10, throughputs_steps_per_s={"v100": 1.0}, attained_service_gpu_s=150.0,
                time_since_arrival_s=100.0),
        JobSpec(id="heavy", steps_remaining=10, priority_weight=4.0, throughputs_steps_per_s={"v100": 1.0},
                attained_service_gpu_s=300.0),
    ]
    allocation = _policy().allocate(build_problem({"v100": 1}, jobs))
    assert allocation.job_fractions.tolist() == [[0.0], [1.0]]
    # heavy crosses 100 weighted GPU-s after (100 - 75) x 4 = 100 s
    assert allocation.valid_for_s == pytest.approx(100.0)


def test_every_job_in_the_last_queue_and_none_waiting_never_changes() -> None:
    jobs = [JobSpec(id="a", steps_remaining=10, throughputs_steps_per_s={"v100": 1.0}, attained_service_gpu_s=5000.0)]
    assert _policy().allocate(build_problem({"v100": 1}, jobs)).valid_for_s is None


def test_bad_state_and_parameters_are_refused_with_a_reason() -> None:
    with pytest.raises(ProblemError, match="policy_state: not a Tiresias state"):
        _policy().allocate(_problem(policy_state='{"promoted": 1}'))
    with pytest.raises(PolicyParameterError, match="thresholds_gpu_s"):
        make_policy("tiresias_perf", thresholds_gpu_s=(10.0, 5.0))
    with pytest.raises(PolicyParameterError, match="starve_limit"):
        make_policy("tiresias_perf", starve_limit=0.0)


def test_what_a_job_ran_round_trips_through_the_json_problem_and_is_checked() -> None:
    data = {
        "worker_types": {"v100": 1},
        "jobs": [{"id": "a", "steps_remaining": 10, "throughputs": {"v100": 1.0}, "attained_service_gpu_s": 7.5,
                  "time_since_last_run_s": 3.0, "last_run_s": 2.0}],
    }
    problem = problem_from_json(data)
    assert [c.tolist() for c in problem.service_columns()] == [[7.5], [3.0], [2.0]]
    assert problem_to_json(problem)["jobs"][0]["attained_service_gpu_s"] == 7.5
    data["jobs"][0]["last_run_s"] = -1.0
    with pytest.raises(ProblemError, match=r"jobs\[0\]\.last_run_s"):
        problem_from_json(data)


def test_an_infinite_starvation_limit_never_promotes() -> None:
    allocation = make_policy("tiresias_perf", thresholds_gpu_s=THRESHOLDS, starve_limit=np.inf).allocate(
        _problem({"v100": 2, "k80": 2})
    )
    assert allocation.policy_state is None  # C stays in queue 2
