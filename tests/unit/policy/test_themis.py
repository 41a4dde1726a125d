"""Themis (finish-time fairness by partial-allocation auctions), checked by hand on one and two GPUs."""

from __future__ import annotations

import numpy as np
import pytest

from common.errors import PolicyParameterError
from policy_service.core import AllocationEntry, JobSpec, build_problem, make_policy
from policy_service.core.baselines import isolated_throughputs
from policy_service.core.formulation import SolveOptions
from policy_service.core.themis import auction, bidders, rho
from tests.unit.policy.builders import assert_feasible


def _job(name, steps=100, waited=0.0, v100=1.0, **others):
    throughputs = {"v100": v100, **others}
    return JobSpec(id=name, steps_remaining=steps, time_since_arrival_s=waited, throughputs_steps_per_s=throughputs)


def test_two_new_jobs_bid_for_one_gpu_and_each_pays_half_of_its_share() -> None:
    # One v100, f = 0.5: of four jobs the two with the worst rho bid. A and B are new (no share in
    # force: rho = inf). C and D hold half the GPU each; alone on their isolated share (1/4 of
    # the GPU: 0.25 steps/s) their 100 steps take 400 s:
    #   rho_C = (1000 + 100 / 0.5) / 400 = 3,   rho_D = (10 + 100 / 0.5) / 400 = 0.525
    # A and B have not waited: their valuations are linear in their share x, and the
    # proportionally fair split of the GPU is x* = 1/2 each. Without A, B would get all of it:
    # A's payment keeps c_A = V_B(1/2) / V_B(1) = 1/2 of x*_A, so A runs 1/4 (B likewise).
    # The half withheld goes to the jobs that did not bid, in equal parts: C and D a quarter each.
    jobs = [_job("A"), _job("B"), _job("C", waited=1000.0), _job("D", waited=10.0)]
    previous = [AllocationEntry(("C",), {"v100": 0.5}), AllocationEntry(("D",), {"v100": 0.5})]
    problem = build_problem({"v100": 1}, jobs, previous=previous)
    baseline = isolated_throughputs(problem)
    assert rho(problem, problem.previous.job_fractions, baseline).tolist() == [np.inf, np.inf, 3.0, 0.525]
    assert bidders(problem, baseline, 0.5).tolist() == [0, 1]

    allocation = make_policy("themis_perf", fairness_knob=0.5).allocate(problem)
    assert allocation.job_fractions[:, 0] == pytest.approx([0.25, 0.25, 0.25, 0.25], abs=1e-4)
    assert_feasible(problem, allocation)


def test_the_jobs_that_did_not_bid_share_the_leftover_equally() -> None:
    # The jobs above on three v100s: A and B bid and get all their time (a GPU each; neither
    # pays: each would get no more without the other). One GPU is left: C and D half of it each,
    # though C's rho is worse (equal parts first; worst rho first only for what they leave).
    jobs = [_job("A"), _job("B"), _job("C", waited=1000.0), _job("D", waited=10.0)]
    previous = [AllocationEntry(("C",), {"v100": 0.5}), AllocationEntry(("D",), {"v100": 0.5})]
    problem = build_problem({"v100": 3}, jobs, previous=previous)
    allocation = make_policy("themis_perf", fairness_knob=0.5).allocate(problem)
    assert allocation.job_fractions[:, 0] == pytest.approx([1.0, 1.0, 0.5, 0.5], abs=1e-4)


def test_a_bidder_that_waited_pays_by_its_finish_time_valuation() -> None:
    # One v100, two jobs that both bid (f = 0): 100 steps at 1 step/s, each waited 100 s.
    # Isolated share 1/2 GPU. x* = 1/2 each (symmetric). Without A, B runs alone:
    #   c_A = V_B(1/2) / V_B(1) = rho_B(1) / rho_B(1/2) = (100 + 100) / (100 + 200) = 2/3.
    problem = build_problem({"v100": 1}, [_job("A", waited=100.0), _job("B", waited=100.0)])
    result = auction(problem, np.array([0, 1]), isolated_throughputs(problem), SolveOptions())
    assert result.proportionally_fair[:, 0] == pytest.approx([0.5, 0.5], abs=1e-4)
    assert result.kept == pytest.approx([2 / 3, 2 / 3], abs=1e-4)
    # With nobody else to take what the payments withheld, it returns to the bidders, up to x*.
    allocation = make_policy("themis_perf", fairness_knob=0.0).allocate(problem)
    assert allocation.job_fractions[:, 0] == pytest.approx([0.5, 0.5], abs=1e-4)


def test_the_aware_auction_gives_each_bidder_the_type_it_gains_most_on() -> None:
    # One v100 and one k80. A runs 4 steps/s on the v100, 1 on the k80; B 1 on either. The
    # proportionally fair allocation gives A the v100 and B the k80, all of their time (the cap):
    # neither takes from the other, so neither pays (c = 1).
    jobs = [_job("A", v100=4.0, k80=1.0), _job("B", v100=1.0, k80=1.0)]
    problem = build_problem({"v100": 1, "k80": 1}, jobs)
    result = auction(problem, np.array([0, 1]), isolated_throughputs(problem), SolveOptions())
    assert result.kept == pytest.approx([1.0, 1.0], abs=1e-4)
    allocation = make_policy("themis_perf", fairness_knob=0.0).allocate(problem)
    assert allocation.job_fractions == pytest.approx(np.array([[1.0, 0.0], [0.0, 1.0]]), abs=1e-4)
    # Agnostic: every type runs A at its v100 speed; both still get all of their time somewhere.
    agnostic = make_policy("themis", fairness_knob=0.0).allocate(problem)
    assert agnostic.job_fractions.sum(axis=1) == pytest.approx([1.0, 1.0], abs=1e-4)
    assert_feasible(problem, agnostic)


def test_the_fairness_knob_is_checked() -> None:
    with pytest.raises(PolicyParameterError, match="fairness_knob"):
        make_policy("themis_perf", fairness_knob=1.0)


def test_at_most_max_bidders_bid_the_worst_off_first() -> None:
    # The four jobs above with f = 0: all four would bid; with max_bidders=3 the three worst
    # (A and B new, rho = inf, then C at 3) bid and D (0.525) does not. An auction's programs grow
    # as the square of its bidders: the cap keeps a solve near a second at any number of jobs.
    jobs = [_job("A"), _job("B"), _job("C", waited=1000.0), _job("D", waited=10.0)]
    previous = [AllocationEntry(("C",), {"v100": 0.5}), AllocationEntry(("D",), {"v100": 0.5})]
    problem = build_problem({"v100": 1}, jobs, previous=previous)
    baseline = isolated_throughputs(problem)
    assert bidders(problem, baseline, 0.0).tolist() == [0, 1, 2, 3]
    assert bidders(problem, baseline, 0.0, max_bidders=3).tolist() == [0, 1, 2]
    capped = make_policy("themis_perf", fairness_knob=0.0, max_bidders=3).allocate(problem)
    assert_feasible(problem, capped)
    with pytest.raises(PolicyParameterError, match="max_bidders"):
        make_policy("themis_perf", max_bidders=0)
