"""core/admitted_max_min.py: unpacked max-min for admitted jobs, columns to matrix, gives the
general path's fractions and baselines to the bit (build_problem -> MaxMinFairness.allocate ->
the reply's cleaned entries; baselines.isolated_throughputs), and leaves every other case to it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from common.errors import ProblemError
from policy_service import answer as answer_module
from policy_service.answer import AdmittedRequest, SolveContext, answer_admitted
from policy_service.core import build_problem
from policy_service.core.admitted import AdmittedJobs
from policy_service.core.admitted_max_min import answer_max_min
from policy_service.core.allocation import NOISE_FRACTION
from policy_service.core.baselines import isolated_throughputs
from policy_service.core.fairness import max_min_fairness
from tests.unit.policy.builders import PRICES, gavel_table, random_jobs

CLUSTERS = [{"v100": 8, "p100": 8, "k80": 8}, {"v100": 4, "p100": 0, "k80": 16}, {"v100": 36, "p100": 36, "k80": 36}]


def _jobs(n: int, seed: int) -> AdmittedJobs:
    specs = [
        dataclasses.replace(job, steps_remaining=int(job.steps_remaining), isolated_time_s=10.0 * i, slo_s=None, entity=None)
        for i, job in enumerate(random_jobs(n, seed, weights=True))
    ]
    if n > 3:  # repeated rows: classes of several jobs
        specs[-1] = dataclasses.replace(specs[0], id="again")
    jobs = AdmittedJobs.of(specs)
    assert jobs is not None
    return jobs


@pytest.mark.parametrize("aware", [True, False])
@pytest.mark.parametrize("cluster", range(len(CLUSTERS)))
@pytest.mark.parametrize("n,seed", [(1, 0), (5, 1), (16, 2), (40, 3)])
def test_the_same_floats_as_the_general_path(aware: bool, cluster: int, n: int, seed: int) -> None:
    counts, jobs, table = CLUSTERS[cluster], _jobs(n, seed), gavel_table()
    policy = max_min_fairness(heterogeneity_aware=aware)
    direct = answer_max_min(policy, jobs, counts, table, PRICES)
    assert direct is not None
    problem = build_problem(counts, jobs, pairs=[], entities=[], prices_per_hour=PRICES, table=table, admitted=True)
    allocation = policy.allocate(problem)
    expected = np.where(np.abs(allocation.job_fractions) < NOISE_FRACTION, 0.0, allocation.job_fractions)
    assert direct.job_ids == problem.job_ids and direct.worker_types == problem.worker_types
    assert direct.fractions.tobytes() == np.ascontiguousarray(expected).tobytes()
    assert direct.isolated_throughputs_steps_per_s.tobytes() == isolated_throughputs(problem).tobytes()


@pytest.mark.parametrize("packing", [False, True])
def test_answer_admitted_answers_the_same(packing: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    context = SolveContext(table=gavel_table())
    request = AdmittedRequest(
        request_id="r", policy="max_min_fairness_perf", worker_types=CLUSTERS[0], jobs=_jobs(24, 5), previous=(),
        packing=packing,
    )
    direct = answer_admitted(request, context)
    monkeypatch.setattr(answer_module, "answer_max_min", lambda *args: None)
    general = answer_admitted(request, context)
    assert direct.fractions == general.fractions  # type: ignore[union-attr]
    assert direct.isolated_throughputs_steps_per_s == general.isolated_throughputs_steps_per_s  # type: ignore[union-attr]
    assert direct.policy_state == general.policy_state and direct.valid_for_s == general.valid_for_s  # type: ignore[union-attr]


def test_other_policies_and_options_go_the_general_way() -> None:
    jobs, table, counts = _jobs(6, 7), gavel_table(), CLUSTERS[0]
    assert answer_max_min(max_min_fairness(space_sharing=True), jobs, counts, table, None) is None
    assert answer_max_min(max_min_fairness(grouping=False), jobs, counts, table, None) is None
    assert answer_max_min(max_min_fairness(prune_dominated=False), jobs, counts, table, None) is None
    assert answer_max_min(max_min_fairness(), jobs, counts, None, None) is None
    assert answer_max_min(max_min_fairness(), AdmittedJobs.of([]), counts, table, None) is None  # type: ignore[arg-type]
    assert answer_max_min(object(), jobs, counts, table, None) is None


def test_jobs_the_shortcut_cannot_vouch_for_go_the_general_way() -> None:
    jobs = _jobs(6, 8)
    oversized = dataclasses.replace(jobs, scale_factors=(64,) + jobs.scale_factors[1:])  # runs nowhere
    assert answer_max_min(max_min_fairness(), oversized, CLUSTERS[0], gavel_table(), None) is None


def test_bad_prices_raise_what_build_problem_raises() -> None:
    with pytest.raises(ProblemError, match="prices_per_hour"):
        answer_max_min(max_min_fairness(), _jobs(3, 9), CLUSTERS[0], gavel_table(), {"v100": 1.0})
