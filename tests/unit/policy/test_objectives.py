"""Comparisons across variants, measured in one objective: heterogeneity awareness and space
sharing never make the aware objective worse; exact makespan beats Gavel's bisection; the
objective a policy reports is what its allocation achieves."""

from __future__ import annotations

import pytest

from policy_service.core import make_policy
from policy_service.core.evaluate import (
    fairness_levels,
    finish_time_fairness_rho,
    job_throughputs,
    makespan_s,
    objective_value,
)
from tests.unit.policy.builders import random_problem

SEEDS = [0, 1, 2, 3]


@pytest.mark.parametrize("seed", SEEDS)
def test_aware_max_min_fairness_is_never_worse_than_agnostic(seed: int) -> None:
    problem = random_problem(40, seed, gpus_per_type=8)
    agnostic = make_policy("max_min_fairness").allocate(problem)
    aware = make_policy("max_min_fairness_perf").allocate(problem)
    packed = make_policy("max_min_fairness_packed").allocate(problem)
    agnostic_level = fairness_levels(problem, agnostic).min()
    assert aware.objective >= agnostic_level - 1e-6
    assert packed.objective >= aware.objective - 1e-6


@pytest.mark.parametrize("seed", SEEDS)
def test_aware_makespan_is_never_worse_than_agnostic(seed: int) -> None:
    problem = random_problem(40, seed, gpus_per_type=8)
    agnostic = make_policy("min_total_duration").allocate(problem)
    aware = make_policy("min_total_duration_perf").allocate(problem)
    packed = make_policy("min_total_duration_packed").allocate(problem)
    assert aware.objective <= makespan_s(problem, agnostic) * (1 + 1e-6)
    assert packed.objective <= aware.objective * (1 + 1e-6)


@pytest.mark.parametrize("seed", SEEDS)
def test_aware_finish_time_fairness_is_never_worse_than_agnostic(seed: int) -> None:
    problem = random_problem(40, seed, gpus_per_type=8)
    agnostic = make_policy("finish_time_fairness").allocate(problem)
    aware = make_policy("finish_time_fairness_perf").allocate(problem)
    packed = make_policy("finish_time_fairness_packed").allocate(problem)
    assert aware.objective <= finish_time_fairness_rho(problem, agnostic).max() * (1 + 1e-6)
    assert packed.objective <= aware.objective * (1 + 1e-5)


@pytest.mark.parametrize("seed", SEEDS)
def test_aware_policies_beat_static_shares_in_their_objective(seed: int) -> None:
    problem = random_problem(40, seed, gpus_per_type=8)
    for baseline in ("isolated", "proportional"):
        allocation = make_policy(baseline).allocate(problem)
        fairness = make_policy("max_min_fairness_perf").allocate(problem).objective
        assert fairness >= fairness_levels(problem, allocation).min() - 1e-6
        total = make_policy("max_sum_throughput_perf").allocate(problem).objective
        assert total >= job_throughputs(problem, allocation).sum() - 1e-6


@pytest.mark.parametrize("seed", SEEDS)
def test_exact_makespan_is_at_most_gavels_bisection(seed: int) -> None:
    problem = random_problem(24, seed, gpus_per_type=8)
    exact = make_policy("min_total_duration_perf").allocate(problem)
    bisection = make_policy("min_total_duration_perf", exact=False).allocate(problem)
    assert exact.objective <= bisection.objective * (1 + 1e-6)
    assert bisection.objective <= exact.objective * 1.05 + 1e-6  # Gavel's 5% bracket
    assert makespan_s(problem, bisection) <= bisection.objective * (1 + 1e-6)


@pytest.mark.parametrize(
    "name",
    [
        "max_min_fairness", "max_min_fairness_perf", "max_min_fairness_packed",
        "max_min_fairness_water_filling_perf", "min_total_duration_perf", "min_total_duration_packed",
        "finish_time_fairness", "finish_time_fairness_perf", "finish_time_fairness_packed",
        "max_sum_throughput_perf", "max_sum_throughput_normalized_by_cost_perf",
    ],
)
def test_reported_objective_is_what_the_allocation_achieves(name: str) -> None:
    problem = random_problem(30, 11, gpus_per_type=8)
    policy = make_policy(name)
    allocation = policy.allocate(problem)
    assert objective_value(policy, problem, allocation) == pytest.approx(allocation.objective, rel=1e-4)
