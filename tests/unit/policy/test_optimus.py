"""Optimus-style throughput-greedy, checked by hand on a 1 v100 + 2 k80 cluster."""

from __future__ import annotations

import numpy as np
import pytest

from policy_service.core import JobSpec, build_problem, make_policy
from policy_service.core.optimus import marginal_gain
from tests.unit.policy.builders import assert_feasible

# (id, GPUs, steps left, v100 / k80 steps/s, arrived s ago). Gains (progress per second per GPU,
# T / (R s)) and remaining time alone on the fastest type:
#   G (gang of 2, fits only the two k80s): k80 5 / (100 x 2) = 0.025;            20 s
#   S1: v100 2 / 100 = 0.02, k80 3 / 100 = 0.03;                                 33 s (k80)
#   S2: v100 4 / 100 = 0.04, k80 1 / 100 = 0.01;                                 25 s (v100)
JOBS = [("G", 2, 100, 6.0, 5.0, 30.0), ("S1", 1, 100, 2.0, 3.0, 20.0), ("S2", 1, 100, 4.0, 1.0, 10.0)]


def _problem():
    jobs = [
        JobSpec(id=name, steps_remaining=steps, scale_factor=sf, time_since_arrival_s=waited,
                throughputs_steps_per_s={"v100": v100, "k80": k80})
        for name, sf, steps, v100, k80, waited in JOBS
    ]
    return build_problem({"v100": 1, "k80": 2}, jobs)


def test_gains_by_hand() -> None:
    assert marginal_gain(_problem()).tolist() == [[-np.inf, 0.025], [0.02, 0.03], [0.04, 0.01]]


def test_the_greedy_buys_the_most_progress_per_gpu_first() -> None:
    problem = _problem()
    allocation = make_policy("optimus_perf").allocate(problem)
    # (S2, v100) 0.04 first; (S1, k80) 0.03; (G, k80) 0.025 needs two k80s, one is left: skipped.
    # SRTF would run G first (20 s left): per GPU its 40 GPU-seconds weigh more than S1's 33.
    assert allocation.job_fractions.tolist() == [[0.0, 0.0], [0.0, 1.0], [1.0, 0.0]]
    assert make_policy("srtf_perf").allocate(problem).job_fractions.tolist() == [[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]]
    assert_feasible(problem, allocation)


def test_a_weight_multiplies_the_gain() -> None:
    # G at weight 2: 0.05 > 0.04, so G takes the two k80s first, S2 the v100, S1 waits.
    jobs = [JobSpec(id=n, steps_remaining=s, scale_factor=sf, time_since_arrival_s=w,
                    priority_weight=2.0 if n == "G" else 1.0, throughputs_steps_per_s={"v100": v, "k80": k})
            for n, sf, s, v, k, w in JOBS]
    allocation = make_policy("optimus_perf").allocate(build_problem({"v100": 1, "k80": 2}, jobs))
    assert allocation.job_fractions.tolist() == [[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]]


@pytest.mark.parametrize("seed", range(4))
def test_agnostic_optimus_orders_by_reference_gain_and_places_anywhere(seed: int) -> None:
    # At v100 speed everywhere: S2 0.04, G 6 / 200 = 0.03, S1 0.02. S2 takes a random type; G the
    # two k80s if S2 left them both, else it is skipped and S1 takes a GPU left.
    problem = _problem()
    allocation = make_policy("optimus", rng=np.random.default_rng(seed)).allocate(problem)
    running = allocation.job_fractions.sum(axis=1)
    assert running[2] == 1.0 and running[0] + running[1] == 1.0
    assert (allocation.job_fractions[0, 1] == 1.0) == (allocation.job_fractions[2, 0] == 1.0)
    assert_feasible(problem, allocation)
