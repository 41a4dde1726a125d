"""The grouped programs (one set of variables per class of interchangeable jobs, pair variables
between classes) reach the same optimum as the per-job, per-job-pair programs Gavel solves."""

from __future__ import annotations

import numpy as np
import pytest

from policy_service.core import make_policy
from policy_service.core.grouping import group_jobs
from tests.unit.policy.builders import assert_feasible, random_problem

CASES = [
    ("max_min_fairness", {}),
    ("max_min_fairness_perf", {}),
    ("max_min_fairness_packed", {}),
    ("min_total_duration_perf", {}),
    ("min_total_duration_packed", {}),
    ("finish_time_fairness_perf", {}),
    ("finish_time_fairness_packed", {}),
    ("max_sum_throughput_perf", {}),
    ("max_sum_throughput_normalized_by_cost_packed_SLOs", {}),
]


def _relative_gap(a: float, b: float) -> float:
    return abs(a - b) / max(1.0, abs(a), abs(b))


@pytest.mark.parametrize("name,params", CASES)
@pytest.mark.parametrize("n,seed", [(16, 0), (48, 1), (128, 2)])
def test_grouped_objective_equals_ungrouped(name: str, params: dict, n: int, seed: int) -> None:
    # Few distinct job types so that classes really have several members.
    problem = random_problem(n, seed, gpus_per_type=max(8, n // 8), multi_gpu=n < 100)
    if "finish_time" in name or "min_total" in name:
        # FTF and makespan read steps and arrival times: make jobs repeat them so they group.
        problem = _with_repeated_progress(problem)
    grouped = make_policy(name, grouping=True, **params).allocate(problem)
    ungrouped = make_policy(name, grouping=False, **params).allocate(problem)
    assert grouped.status == "optimal", grouped.reason
    assert ungrouped.status == "optimal", ungrouped.reason
    assert _relative_gap(grouped.objective, ungrouped.objective) < 1e-6, (grouped.objective, ungrouped.objective)
    assert_feasible(problem, grouped)
    assert_feasible(problem, ungrouped)


def _with_repeated_progress(problem):
    from dataclasses import replace

    steps = np.asarray(problem.steps_remaining)
    waited = np.asarray(problem.time_since_arrival_s)
    # Three progress levels, so jobs of one type fall into a few classes.
    level = np.arange(problem.num_jobs) % 3
    new_steps = np.array([5e4, 2e5, 1e6])[level]
    new_waited = np.array([0.0, 600.0, 3600.0])[level]
    assert steps.shape == new_steps.shape and waited.shape == new_waited.shape
    new_steps.setflags(write=False)
    new_waited.setflags(write=False)
    return replace(problem, steps_remaining=new_steps, time_since_arrival_s=new_waited)


def test_grouping_shrinks_the_program() -> None:
    problem = random_problem(512, 4)
    classes = group_jobs([problem.throughputs_steps_per_s, problem.scale_factors], problem.num_jobs)
    assert classes.num_classes <= 83  # Gavel's table has 83 (job type, scale factor) keys
    assert classes.sizes.sum() == problem.num_jobs
    assert (classes.class_of_job[classes.representative] == np.arange(classes.num_classes)).all()


def test_group_jobs_treats_nan_as_equal() -> None:
    classes = group_jobs([np.array([1.0, np.nan, np.nan, 1.0])], 4)
    assert classes.class_of_job.tolist() == [0, 1, 1, 0]


def test_water_filling_levels_match_ungrouped() -> None:
    problem = random_problem(40, 5, gpus_per_type=8, entities=("a", "b"))
    from policy_service.core.evaluate import fairness_levels

    grouped = make_policy("max_min_fairness_water_filling_perf").allocate(problem)
    ungrouped = make_policy("max_min_fairness_water_filling_perf", grouping=False).allocate(problem)
    # The water-filling (leximin) levels are unique even when allocations are not.
    a = np.sort(fairness_levels(problem, grouped))
    b = np.sort(fairness_levels(problem, ungrouped))
    assert a == pytest.approx(b, rel=1e-4, abs=1e-6)


PACKED = [
    "max_min_fairness_packed", "min_total_duration_packed", "finish_time_fairness_packed",
    "max_sum_throughput_normalized_by_cost_packed_SLOs",
]


@pytest.mark.parametrize("name", PACKED)
@pytest.mark.parametrize("n,seed", [(24, 3), (64, 4)])
def test_partner_key_variables_reach_the_per_job_pair_optimum(name: str, n: int, seed: int) -> None:
    """The second exact pair form (class x partner job type, with balance and no-self rows)."""
    problem = random_problem(n, seed, gpus_per_type=8, multi_gpu=n < 50, weights=True)
    partner = make_policy(name, pair_variables="partner_keys").allocate(problem)
    class_pairs = make_policy(name, pair_variables="class_pairs").allocate(problem)
    ungrouped = make_policy(name, grouping=False).allocate(problem)
    assert partner.status == "optimal", partner.reason
    assert _relative_gap(partner.objective, ungrouped.objective) < 1e-6, (partner.objective, ungrouped.objective)
    assert _relative_gap(class_pairs.objective, ungrouped.objective) < 1e-6
    assert_feasible(problem, partner)
    from policy_service.core.evaluate import objective_value

    assert objective_value(make_policy(name), problem, partner) == pytest.approx(partner.objective, rel=1e-5)


def test_partner_keys_are_chosen_when_classes_are_per_job() -> None:
    from policy_service.core.formulation import SolveOptions, build_space

    problem = random_problem(512, 1)
    space = build_space(problem, packing=True, options=SolveOptions(), columns=[problem.steps_remaining])
    assert space.mode == "partner_keys"
    space = build_space(problem, packing=True, options=SolveOptions())
    assert space.mode == "class_pairs"


def test_single_job_classes_are_never_paired_with_themselves() -> None:
    """Two jobs of one type, each its own class (different steps): any packing pairs them."""
    from policy_service.core import JobSpec, PairSpec, build_problem
    from policy_service.core.formulation import SolveOptions, build_space

    jobs = [JobSpec(id=str(i), steps_remaining=100.0 * (i + 1), job_type="A", throughputs_steps_per_s={"v100": 1.0})
            for i in range(2)]
    problem = build_problem({"v100": 1}, jobs, pairs=[PairSpec(("0", "1"), {"v100": (0.9, 0.9)})])
    allocation = make_policy("min_total_duration_packed", pair_variables="partner_keys").allocate(problem)
    assert_feasible(problem, allocation)
    # Packed at 0.9 each until job 0's 100 steps are done (111.1 s), then job 1 alone at 1.0.
    assert allocation.objective == pytest.approx(100 / 0.9 + 100, rel=1e-5)
    space = build_space(problem, packing=True, options=SolveOptions(pair_variables="partner_keys"),
                        columns=[problem.steps_remaining])
    assert space.mode == "partner_keys"


def test_water_filling_packed_with_entities_matches_per_job_pairs() -> None:
    from policy_service.core.evaluate import fairness_levels

    problem = random_problem(24, 8, gpus_per_type=8, entities=("a", "b", "c"), multi_gpu=False)
    partner = make_policy("max_min_fairness_water_filling_packed", pair_variables="partner_keys").allocate(problem)
    ungrouped = make_policy("max_min_fairness_water_filling_packed", grouping=False).allocate(problem)
    assert_feasible(problem, partner)
    a = np.sort(fairness_levels(problem, partner))
    b = np.sort(fairness_levels(problem, ungrouped))
    assert a == pytest.approx(b, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_the_direct_clarabel_max_min_reaches_the_cvxpy_optimum(seed) -> None:
    """fairness.py sends max-min fairness (no packing) straight to CLARABEL; the cvxpy model of
    the same LP (used for every other solver) must agree on the optimum."""
    from policy_service.core import make_policy

    problem = random_problem(40 + 10 * seed, seed, gpus_per_type=8)
    direct = make_policy("max_min_fairness_perf").allocate(problem)
    modelled = make_policy("max_min_fairness_perf", solver="ECOS").allocate(problem)
    assert direct.status == modelled.status == "optimal"
    assert direct.objective == pytest.approx(modelled.objective, rel=1e-6)
