"""Every registered policy returns a feasible allocation on random instances."""

from __future__ import annotations

import numpy as np
import pytest

from policy_service.core import JobSpec, build_problem, make_policy, policy_names
from tests.unit.policy.builders import PRICES, TYPES, assert_feasible, gavel_table, random_jobs, random_problem


def _single_gpu_problem(n: int, seed: int):
    jobs = random_jobs(n, seed, multi_gpu=False, with_slos=True)
    return build_problem(dict.fromkeys(TYPES, max(4, n // 4)), jobs, table=gavel_table(), prices_per_hour=PRICES)


@pytest.mark.parametrize("name", policy_names())
@pytest.mark.parametrize("seed", [0, 1])
def test_every_policy_is_feasible_on_random_problems(name: str, seed: int) -> None:
    problem = _single_gpu_problem(24, seed) if name == "allox" else random_problem(24, seed, with_slos=True)
    params = {"rng": np.random.default_rng(seed)} if name in ("fifo", "gandiva") else {}
    allocation = make_policy(name, **params).allocate(problem)
    assert allocation.status in ("optimal", "optimal_inaccurate", "infeasible"), allocation.reason
    assert allocation.policy == name
    assert_feasible(problem, allocation)


@pytest.mark.parametrize("name", policy_names())
def test_every_policy_handles_a_crowded_cluster(name: str) -> None:
    """Many more jobs than GPUs (scale factors up to 8 on 8-GPU types)."""
    problem = _single_gpu_problem(64, 7) if name == "allox" else random_problem(64, 3, gpus_per_type=8)
    allocation = make_policy(name).allocate(problem)
    assert allocation.status.startswith("optimal") or allocation.status == "infeasible"
    assert_feasible(problem, allocation)


@pytest.mark.parametrize("name", policy_names())
def test_every_policy_accepts_an_empty_problem(name: str) -> None:
    problem = build_problem({"v100": 2}, [])
    allocation = make_policy(name).allocate(problem)
    assert allocation.job_fractions.shape == (0, 1)
    assert allocation.status == "optimal"


@pytest.mark.parametrize(
    "name", [n for n in policy_names() if n not in ("allox", "fifo", "gandiva", "isolated", "proportional")]
)
def test_convex_policies_never_give_time_where_a_gang_does_not_fit(name: str) -> None:
    jobs = [
        JobSpec(id="big", steps_remaining=1e4, scale_factor=8, throughputs_steps_per_s={"v100": 5.0, "k80": 9.0}),
        JobSpec(id="small", steps_remaining=1e4, throughputs_steps_per_s={"v100": 1.0, "k80": 1.0}),
    ]
    problem = build_problem({"v100": 8, "k80": 4}, jobs, prices_per_hour={"v100": 2.0, "k80": 1.0})
    allocation = make_policy(name).allocate(problem)
    assert allocation.job_fractions[0, 1] == 0.0  # 8 GPUs do not fit on 4 k80s
    assert_feasible(problem, allocation)
