"""Optima worked out by hand on tiny problems, one per objective."""

from __future__ import annotations

import numpy as np
import pytest

from policy_service.core import JobSpec, build_problem, expand_pairs, make_policy
from policy_service.core.baselines import equal_share_throughputs, isolated_fractions
from policy_service.core.evaluate import fairness_levels
from tests.unit.policy.builders import assert_feasible, simple_problem

# Gavel's table: ResNet-50 (bs 64) runs 7x faster on a V100 than on a K80; the recommendation
# model (bs 1024) runs *faster* on the K80.
RESNET = {"v100": 4.4, "k80": 0.62}
RECOMMENDATION = {"v100": 13.3, "k80": 20.1}


def test_aware_max_min_fairness_moves_the_job_with_the_larger_speedup_to_the_fast_type() -> None:
    problem = simple_problem({"v100": 1, "k80": 1}, [RESNET, RECOMMENDATION])
    aware = make_policy("max_min_fairness_perf").allocate(problem)
    agnostic = make_policy("max_min_fairness").allocate(problem)
    # The recommendation job is at its best with the whole K80 (20.1 vs an equal-share
    # throughput of (13.3 + 20.1) / 2); it cannot do better, so that is the max-min level.
    assert aware.objective == pytest.approx(20.1 / 16.7, abs=1e-6)
    assert aware.job_fractions[1] == pytest.approx([0.0, 1.0], abs=1e-6)
    assert aware.job_fractions[0, 0] > 0.68  # ResNet gets (most of) the V100
    assert aware.job_fractions[0, 1] == pytest.approx(0.0, abs=1e-6)
    # Agnostic: every job gets all of its time somewhere, level 1 in time units.
    assert agnostic.objective == pytest.approx(1.0, abs=1e-6)
    # Measured in the aware objective, the agnostic allocation is worse.
    assert fairness_levels(problem, agnostic).min() < aware.objective - 0.05


def test_max_min_fairness_counts_gpu_time_of_multi_gpu_jobs() -> None:
    # Same throughputs; job 1 is a 2-GPU gang. Gavel multiplies levels by the scale factor, so
    # the 1-GPU job gets twice the time fraction: x0 = 2 * x1 and x0 + 2 * x1 = 2 GPUs.
    problem = simple_problem({"v100": 2}, [{"v100": 1.0}, {"v100": 1.0}], scale_factors=[1, 2])
    allocation = make_policy("max_min_fairness_perf").allocate(problem)
    assert allocation.job_fractions[:, 0] == pytest.approx([1.0, 0.5], abs=1e-6)


def test_priority_weights_scale_the_share() -> None:
    problem = simple_problem({"v100": 1}, [{"v100": 1.0}, {"v100": 1.0}], weights=[1.0, 3.0])
    allocation = make_policy("max_min_fairness_perf").allocate(problem)
    assert allocation.job_fractions[:, 0] == pytest.approx([0.25, 0.75], abs=1e-6)


def test_packing_helps_when_the_pair_runs_faster_than_time_sharing() -> None:
    jobs = [
        JobSpec(id="a", steps_remaining=1e4, throughputs_steps_per_s={"v100": 1.0}),
        JobSpec(id="b", steps_remaining=1e4, throughputs_steps_per_s={"v100": 1.0}),
    ]
    from policy_service.core import PairSpec

    problem = build_problem({"v100": 1}, jobs, pairs=[PairSpec(("a", "b"), {"v100": (0.8, 0.7)})])
    alone = make_policy("max_min_fairness_perf").allocate(problem)
    packed = make_policy("max_min_fairness_packed").allocate(problem)
    assert alone.objective == pytest.approx(0.5, abs=1e-6)  # time-share one GPU
    # Pack for a fraction p and let b run alone for 1 - p: 0.8 p = 0.7 p + (1 - p) -> p = 10/11.
    assert packed.objective == pytest.approx(8 / 11, abs=1e-6)
    assert packed.pairs.pair_time.sum() == pytest.approx(10 / 11, abs=1e-6)
    assert packed.job_fractions[:, 0] == pytest.approx([0.0, 1 / 11], abs=1e-6)
    assert_feasible(problem, packed)


def test_a_dominated_pair_is_never_used() -> None:
    jobs = [
        JobSpec(id="a", steps_remaining=1e4, throughputs_steps_per_s={"v100": 1.0}),
        JobSpec(id="b", steps_remaining=1e4, throughputs_steps_per_s={"v100": 1.0}),
    ]
    from policy_service.core import PairSpec

    # 0.5 + 0.4 < 1: time-sharing the GPU beats packing.
    problem = build_problem({"v100": 1}, jobs, pairs=[PairSpec(("a", "b"), {"v100": (0.5, 0.4)})])
    for prune in (True, False):
        packed = make_policy("max_min_fairness_packed", prune_dominated=prune).allocate(problem)
        assert packed.objective == pytest.approx(0.5, abs=1e-6)


@pytest.mark.parametrize("exact", [True, False])
def test_makespan_of_two_jobs_sharing_one_gpu(exact: bool) -> None:
    # 100 and 200 steps at 1 and 2 steps/s: 100 s each alone, 200 s together at best.
    problem = simple_problem({"v100": 1}, [{"v100": 1.0}, {"v100": 2.0}], steps=[100.0, 200.0])
    allocation = make_policy("min_total_duration_perf", exact=exact).allocate(problem)
    if exact:
        assert allocation.objective == pytest.approx(200.0, rel=1e-6)
        assert allocation.job_fractions[:, 0] == pytest.approx([0.5, 0.5], abs=1e-6)
    else:  # Gavel's bisection stops within 5%
        assert 200.0 <= allocation.objective <= 210.0


def test_makespan_puts_the_long_job_on_the_fast_type() -> None:
    # Job 0: 1000 steps at 10 (v100) / 1 (k80). Job 1: 100 steps at 1 / 1. Best: job 0 on the
    # V100 (100 s), job 1 on the K80 (100 s).
    problem = simple_problem(
        {"v100": 1, "k80": 1}, [{"v100": 10.0, "k80": 1.0}, {"v100": 1.0, "k80": 1.0}], steps=[1000.0, 100.0]
    )
    allocation = make_policy("min_total_duration_perf").allocate(problem)
    assert allocation.objective == pytest.approx(100.0, rel=1e-6)
    assert allocation.job_fractions == pytest.approx(np.array([[1.0, 0.0], [0.0, 1.0]]), abs=1e-6)


def test_agnostic_makespan_assumes_every_type_runs_at_v100_speed() -> None:
    problem = simple_problem({"v100": 1, "k80": 1}, [{"v100": 10.0, "k80": 1.0}], steps=[1000.0])
    allocation = make_policy("min_total_duration").allocate(problem)
    assert allocation.objective == pytest.approx(100.0, rel=1e-6)  # it believes 10 steps/s anywhere


def test_finish_time_fairness_of_identical_jobs_is_one() -> None:
    # Two identical jobs on one GPU: isolated share 1/2 each, and so is the best allocation.
    problem = simple_problem({"v100": 1}, [{"v100": 2.0}, {"v100": 2.0}], steps=[100.0, 100.0])
    allocation = make_policy("finish_time_fairness_perf").allocate(problem)
    assert allocation.objective == pytest.approx(1.0, rel=1e-5)
    assert allocation.job_fractions[:, 0] == pytest.approx([0.5, 0.5], abs=1e-5)


def test_finish_time_fairness_favours_the_job_that_waited() -> None:
    jobs = [
        JobSpec(id="old", steps_remaining=100.0, time_since_arrival_s=100.0, throughputs_steps_per_s={"v100": 1.0}),
        JobSpec(id="new", steps_remaining=100.0, time_since_arrival_s=0.0, throughputs_steps_per_s={"v100": 1.0}),
    ]
    problem = build_problem({"v100": 1}, jobs)
    allocation = make_policy("finish_time_fairness_perf").allocate(problem)
    # rho = (t + 100 / x) / 200: equal when 100 + 100/x0 = 100/x1 with x0 + x1 = 1.
    x0, x1 = allocation.job_fractions[:, 0]
    assert x0 > x1
    assert 100 + 100 / x0 == pytest.approx(100 / x1, rel=1e-4)


def test_max_sum_throughput_gives_the_gpu_to_the_fastest_job() -> None:
    problem = simple_problem({"v100": 1}, [{"v100": 4.0}, {"v100": 2.0}])
    allocation = make_policy("max_sum_throughput_perf").allocate(problem)
    assert allocation.objective == pytest.approx(4.0, rel=1e-6)
    assert allocation.job_fractions[:, 0] == pytest.approx([1.0, 0.0], abs=1e-6)


def test_cost_normalised_throughput_prefers_steps_per_dollar() -> None:
    # 4 steps/s for $2/h on the V100 (2 per $), 1.5 steps/s for $0.5/h on the K80 (3 per $).
    problem = simple_problem(
        {"v100": 1, "k80": 1}, [{"v100": 4.0, "k80": 1.5}], prices_per_hour={"v100": 2.0, "k80": 0.5}
    )
    allocation = make_policy("max_sum_throughput_normalized_by_cost_perf").allocate(problem)
    assert allocation.objective == pytest.approx(3.0, rel=1e-6)
    assert allocation.job_fractions[0] == pytest.approx([0.0, 1.0], abs=1e-6)


def test_fifo_perf_gives_the_oldest_job_the_fastest_type() -> None:
    jobs = [
        JobSpec(id=str(i), steps_remaining=1.0, time_since_arrival_s=t,
                throughputs_steps_per_s={"v100": 3.0, "k80": 1.0})
        for i, t in enumerate([10.0, 30.0, 20.0])
    ]
    problem = build_problem({"v100": 1, "k80": 1}, jobs)
    allocation = make_policy("fifo_perf").allocate(problem)
    # Arrival order: job 1 (30 s ago), job 2, job 0.
    assert allocation.job_fractions.tolist() == [[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]


def test_fifo_packed_packs_a_queued_job_with_a_good_partner() -> None:
    from policy_service.core import PairSpec

    jobs = [
        JobSpec(id=str(i), steps_remaining=1.0, time_since_arrival_s=10.0 - i, throughputs_steps_per_s={"v100": 1.0})
        for i in range(2)
    ]
    problem = build_problem({"v100": 1}, jobs, pairs=[PairSpec(("0", "1"), {"v100": (0.9, 0.8)})])
    allocation = make_policy("fifo_packed").allocate(problem)
    pair_jobs, pair_fractions = expand_pairs(allocation.pairs)
    assert pair_jobs.tolist() == [[0, 1]]
    assert pair_fractions.tolist() == [[1.0]]
    assert allocation.job_fractions.sum() == 0.0


def test_isolated_and_proportional_shares() -> None:
    problem = simple_problem({"v100": 2, "k80": 4}, [{"v100": 1.0, "k80": 1.0}] * 3, scale_factors=[1, 1, 2])
    x = make_policy("isolated").allocate(problem).job_fractions
    assert x == pytest.approx(isolated_fractions(problem))
    # 1/3 of each type's GPUs per job: 2/3 and 4/3 GPUs -> 2/3 + 4/3 = 2 > 1: scaled to 1.
    assert x[0] == pytest.approx([1 / 3, 2 / 3])
    assert x[2] == pytest.approx([1 / 3, 2 / 3])  # a 2-GPU gang: half the time per GPU, same sum
    # 6 GPUs, 4 asked: every job gets all of its time, split 2:4 like the cluster.
    p = make_policy("proportional").allocate(problem).job_fractions
    assert p[0] == pytest.approx([2 / 6, 4 / 6])
    crowded = simple_problem({"v100": 2, "k80": 4}, [{"v100": 1.0, "k80": 1.0}] * 10)
    p = make_policy("proportional").allocate(crowded).job_fractions
    assert p[0] == pytest.approx([0.6 * 2 / 6, 0.6 * 4 / 6])  # alpha = 6 GPUs / 10 asked
    assert equal_share_throughputs(problem) == pytest.approx([1.0, 1.0, 1.0])


def test_allox_runs_the_shortest_job_first() -> None:
    problem = simple_problem({"v100": 1}, [{"v100": 1.0}, {"v100": 1.0}], steps=[500.0, 100.0])
    allocation = make_policy("allox").allocate(problem)
    assert allocation.job_fractions[:, 0].tolist() == [0.0, 1.0]


def test_allox_keeps_jobs_that_already_hold_a_gpu() -> None:
    from policy_service.core import AllocationEntry

    problem = simple_problem(
        {"v100": 1}, [{"v100": 1.0}, {"v100": 1.0}], steps=[500.0, 100.0],
        previous=[AllocationEntry(("0",), {"v100": 1.0})],
    )
    allocation = make_policy("allox").allocate(problem)
    assert allocation.job_fractions[:, 0].tolist() == [1.0, 0.0]


def test_allox_refuses_multi_gpu_jobs_naming_the_field() -> None:
    from common.errors import ProblemError

    problem = simple_problem({"v100": 4}, [{"v100": 1.0}, {"v100": 1.0}], scale_factors=[1, 2])
    with pytest.raises(ProblemError, match=r"jobs\[1\]\.scale_factor"):
        make_policy("allox").allocate(problem)


def test_gandiva_packs_random_pairs_only_when_oversubscribed() -> None:
    from policy_service.core import PairSpec

    ids = [str(i) for i in range(4)]
    jobs = [JobSpec(id=i, steps_remaining=1.0, throughputs_steps_per_s={"v100": 1.0}) for i in ids]
    pairs = [PairSpec((a, b), {"v100": (0.8, 0.8)}) for i, a in enumerate(ids) for b in ids[i + 1:]]
    roomy = build_problem({"v100": 4}, jobs, pairs=pairs)
    crowded = build_problem({"v100": 2}, jobs, pairs=pairs)
    assert make_policy("gandiva").allocate(roomy).pairs.num_pairs == 0
    allocation = make_policy("gandiva", rng=np.random.default_rng(3)).allocate(crowded)
    assert allocation.pairs.num_pairs == 2  # 4 jobs -> 2 random pairs, each 1 GPU of 2
    assert allocation.total_time_per_job() == pytest.approx([1.0] * 4)
    assert_feasible(crowded, allocation)
