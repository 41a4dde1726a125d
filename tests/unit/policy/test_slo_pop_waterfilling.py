"""SLO infeasibility, the POP wrapper, and hierarchical water filling."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest
import scipy.sparse as sp

from policy_service.core import Entity, JobSpec, build_problem, make_policy, pop
from policy_service.core.evaluate import fairness_levels, finish_time_fairness_rho
from tests.unit.policy.builders import assert_feasible, random_problem

PRICES = {"v100": 2.0}


def _slo_problem(slo_s: float, time_since_arrival_s: float = 0.0):
    jobs = [
        JobSpec(id="urgent", steps_remaining=1000.0, slo_s=slo_s, time_since_arrival_s=time_since_arrival_s,
                throughputs_steps_per_s={"v100": 2.0}),
        JobSpec(id="relaxed", steps_remaining=1000.0, throughputs_steps_per_s={"v100": 4.0}),
    ]
    return build_problem({"v100": 1}, jobs, prices_per_hour=PRICES)


def test_slos_are_met_when_possible() -> None:
    # 1000 steps within 1000 s at 2 steps/s: the urgent job needs half of the GPU, the faster
    # job gets the rest.
    allocation = make_policy("max_sum_throughput_normalized_by_cost_perf_SLOs").allocate(_slo_problem(1000.0))
    assert allocation.status == "optimal"
    assert allocation.job_fractions[:, 0] == pytest.approx([0.5, 0.5], abs=1e-6)
    # Without SLOs, the faster job takes the GPU.
    free = make_policy("max_sum_throughput_normalized_by_cost_perf").allocate(_slo_problem(1000.0))
    assert free.job_fractions[:, 0] == pytest.approx([0.0, 1.0], abs=1e-6)


def test_an_slo_no_job_could_meet_is_infeasible_and_names_the_job() -> None:
    allocation = make_policy("max_sum_throughput_normalized_by_cost_perf_SLOs").allocate(_slo_problem(400.0))
    assert allocation.status == "infeasible"
    assert "'urgent'" in allocation.reason and "2.5 steps/s" in allocation.reason
    assert "\n" not in allocation.reason
    assert allocation.objective is None
    assert not allocation.job_fractions.any()


def test_a_passed_deadline_is_infeasible() -> None:
    allocation = make_policy("max_sum_throughput_normalized_by_cost_packed_SLOs").allocate(_slo_problem(100.0, 200.0))
    assert allocation.status == "infeasible"
    assert "past its deadline" in allocation.reason and "'urgent'" in allocation.reason


def test_slos_that_only_fail_together_say_so() -> None:
    jobs = [
        JobSpec(id=str(i), steps_remaining=1000.0, slo_s=600.0, throughputs_steps_per_s={"v100": 2.0}) for i in range(2)
    ]
    problem = build_problem({"v100": 1}, jobs, prices_per_hour=PRICES)
    allocation = make_policy("max_sum_throughput_normalized_by_cost_perf_SLOs").allocate(problem)
    assert allocation.status == "infeasible"
    assert "cannot all be met at once" in allocation.reason


def test_gavel_drops_infeasible_slos_when_asked() -> None:
    allocation = make_policy("max_sum_throughput_normalized_by_cost_perf_SLOs", on_infeasible_slos="drop").allocate(
        _slo_problem(400.0)
    )
    assert allocation.status == "optimal"
    assert "solved without SLOs" in allocation.reason
    assert allocation.job_fractions[:, 0] == pytest.approx([0.0, 1.0], abs=1e-6)


def test_cost_policies_need_prices() -> None:
    from common.errors import ProblemError

    problem = build_problem({"v100": 1}, [JobSpec(id="a", steps_remaining=1.0, throughputs_steps_per_s={"v100": 1.0})])
    with pytest.raises(ProblemError, match="prices_per_hour"):
        make_policy("max_sum_throughput_normalized_by_cost_perf").allocate(problem)


@pytest.mark.parametrize("name", ["max_min_fairness_perf", "max_min_fairness_packed", "finish_time_fairness_perf"])
@pytest.mark.parametrize("strategy", ["stratified", "random"])
def test_pop_is_feasible_and_close_to_the_full_solve(name: str, strategy: str) -> None:
    problem = random_problem(256, 9, gpus_per_type=64)
    full = make_policy(name).allocate(problem)
    split = pop(make_policy(name), 4, strategy=strategy, rng=np.random.default_rng(1)).allocate(problem)
    assert split.status == "optimal"
    assert_feasible(problem, split)
    if name.startswith("finish_time"):
        assert split.objective == pytest.approx(finish_time_fairness_rho(problem, split).max())
        assert split.objective <= full.objective * (1.10 if strategy == "stratified" else 1.30)
    else:
        assert split.objective == pytest.approx(fairness_levels(problem, split).min())
        assert split.objective >= full.objective * (0.95 if strategy == "stratified" else 0.75)


def test_pop_with_one_part_is_the_policy_itself() -> None:
    problem = random_problem(32, 2)
    full = make_policy("max_min_fairness_perf").allocate(problem)
    single = pop(make_policy("max_min_fairness_perf"), 1).allocate(problem)
    assert single.objective == pytest.approx(full.objective, rel=1e-6)


def _max_level_of(problem, policy, allocation, c_jobs):
    """The best level one job can reach while every other job keeps at least its level."""
    from policy_service.core.baselines import equal_share_throughputs
    from policy_service.core.formulation import SolveOptions, build_space

    space = build_space(problem, packing=False, options=SolveOptions(grouping=False))
    normalised = sp.diags(1.0 / equal_share_throughputs(problem)) @ space.throughput()
    levels = normalised @ np.concatenate([allocation.job_fractions[space.x_index >= 0]])
    v = cp.Variable(space.num_vars, nonneg=True)
    floor = levels * (1 - 1e-6) - 1e-9
    results = []
    for j in c_jobs:
        others = np.arange(problem.num_jobs) != j
        program = cp.Problem(
            cp.Maximize(normalised[j] @ v),
            [normalised[np.flatnonzero(others)] @ v >= floor[others], *space.constraints(v)],
        )
        program.solve(solver="CLARABEL")
        results.append((levels[j], program.value))
    return results


def test_water_filling_leaves_no_job_able_to_rise_alone() -> None:
    """Leximin check: no job can get more without taking from another job (per-job LPs)."""
    problem = random_problem(12, 3, gpus_per_type=4, multi_gpu=False)
    policy = make_policy("max_min_fairness_water_filling_perf")
    allocation = policy.allocate(problem)
    assert_feasible(problem, allocation)
    for level, best in _max_level_of(problem, policy, allocation, range(problem.num_jobs)):
        assert best <= level * (1 + 1e-4) + 1e-6


def test_water_filling_beats_plain_max_min_for_the_jobs_above_the_minimum() -> None:
    problem = random_problem(30, 6, gpus_per_type=8)
    water = make_policy("max_min_fairness_water_filling_perf").allocate(problem)
    plain = make_policy("max_min_fairness_perf").allocate(problem)
    assert water.objective == pytest.approx(plain.objective, rel=1e-4)  # same first level
    # Water filling raises the rest as far as possible: sorted levels dominate lexicographically.
    a, b = np.sort(fairness_levels(problem, water)), np.sort(fairness_levels(problem, plain))
    first_difference = np.flatnonzero(np.abs(a - b) > 1e-4 * np.maximum(1, b))
    assert len(first_difference) == 0 or a[first_difference[0]] > b[first_difference[0]]


def test_entity_weights_split_the_cluster() -> None:
    jobs = [JobSpec(id=f"{e}{i}", steps_remaining=1.0, entity=e, throughputs_steps_per_s={"v100": 1.0})
            for e in ("a", "b") for i in range(3)]
    problem = build_problem({"v100": 3}, jobs, entities=[Entity("a", 1.0), Entity("b", 2.0)])
    allocation = make_policy("max_min_fairness_water_filling_perf").allocate(problem)
    per_entity = allocation.job_fractions[:, 0].reshape(2, 3).sum(axis=1)
    assert per_entity == pytest.approx([1.0, 2.0], abs=1e-4)  # 3 GPUs split 1:2


def test_a_fifo_entity_serves_its_oldest_job_first() -> None:
    jobs = [
        JobSpec(id=f"f{i}", steps_remaining=1.0, entity="fifo", time_since_arrival_s=float(100 - i),
                throughputs_steps_per_s={"v100": 1.0})
        for i in range(3)
    ] + [JobSpec(id="x", steps_remaining=1.0, entity="fair", throughputs_steps_per_s={"v100": 1.0})]
    problem = build_problem(
        {"v100": 2}, jobs, entities=[Entity("fifo", 1.0, "fifo"), Entity("fair", 1.0, "fairness")]
    )
    allocation = make_policy("max_min_fairness_water_filling_perf").allocate(problem)
    x = allocation.job_fractions[:, 0]
    # Each entity gets one GPU; in the FIFO entity the oldest job takes all of it.
    assert x == pytest.approx([1.0, 0.0, 0.0, 1.0], abs=1e-4)
