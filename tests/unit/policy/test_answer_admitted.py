"""The in-process answer (answer_admitted, the simulator's fast path) is answer(admitted=True)'s,
value for value; the reply's entries are what allocation_to_json writes; the admitted shortcuts
(jobs column by column, plain previous entries) build the problem the checks build."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from common.messages import (
    AllocationEntry,
    AllocationRequested,
    PolicyJob,
    PolicyProblem,
)
from policy_service.answer import (
    AdmittedAnswer,
    AdmittedRequest,
    SolveContext,
    answer,
    answer_admitted,
    computed_message,
    problem_from_message,
    reads_previous,
)
from policy_service.core import REGISTRY, allocation_to_json, build_problem
from policy_service.core import previous as previous_module
from policy_service.core.admitted import AdmittedJobs
from tests.unit.policy.builders import PRICES, gavel_table, random_jobs

COUNTS = {"v100": 8, "p100": 8, "k80": 8}
CONTEXT = SolveContext(table=gavel_table(), prices_per_hour=PRICES)


def _jobs(n: int, seed: int) -> tuple[PolicyJob, ...]:
    return tuple(
        PolicyJob(j.id, j.job_type, j.scale_factor, j.priority_weight, int(j.steps_remaining), j.time_since_arrival_s,  # type: ignore[arg-type]
                  slo_s=j.slo_s, isolated_time_s=3.0 * i)
        for i, j in enumerate(random_jobs(n, seed, with_slos=True, weights=True))
    )


def _previous(jobs: tuple[PolicyJob, ...]) -> tuple[AllocationEntry, ...]:
    return tuple(AllocationEntry((j.job_id,), {"v100": 0.25, "k80": 0.5}) for j in jobs[::3]) + (
        AllocationEntry(("gone",), {"v100": 1.0}),  # a job that has left: ignored
    )


@pytest.mark.parametrize(
    "policy", ["max_min_fairness", "max_min_fairness_perf", "max_min_fairness_packed", "finish_time_fairness"]
)
@pytest.mark.parametrize("n,seed", [(1, 0), (17, 1), (40, 2)])
def test_the_admitted_answer_is_the_messages(policy: str, n: int, seed: int) -> None:
    jobs, packing = _jobs(n, seed), policy.endswith("_packed")
    previous = _previous(jobs)
    request = AllocationRequested(
        request_id="r", policy=policy, deadline_s=1.0, seed=5, policy_state="",
        problem=PolicyProblem(worker_types=COUNTS, jobs=jobs, pairs=None if packing else (), previous=previous),
    )
    reply = answer(request, CONTEXT, admitted=True)
    fields = ("job_id", "job_type", "scale_factor", "priority_weight", "steps_remaining", "time_since_arrival_s",
              "slo_s", "isolated_time_s")
    admitted = answer_admitted(
        AdmittedRequest(
            request_id="r", policy=policy, worker_types=COUNTS,
            jobs=AdmittedJobs(*(tuple(getattr(j, name) for j in jobs) for name in fields)),  # type: ignore[arg-type]
            previous=previous, packing=packing, seed=5,
        ),
        CONTEXT,
    )
    assert isinstance(admitted, AdmittedAnswer)
    assert admitted.fractions == {e.job_ids: e.fractions for e in reply.entries}  # type: ignore[union-attr]
    assert admitted.isolated_throughputs_steps_per_s == reply.isolated_throughputs_steps_per_s  # type: ignore[union-attr]
    assert admitted.policy_state == reply.policy_state  # type: ignore[union-attr]


def test_an_admitted_job_out_of_range_fails_with_the_checks_error() -> None:
    jobs = _jobs(4, 3)
    bad = AdmittedJobs(
        tuple(j.job_id for j in jobs), tuple(j.job_type for j in jobs), tuple(j.scale_factor for j in jobs),
        tuple(j.priority_weight for j in jobs), tuple(j.steps_remaining for j in jobs),
        (1.0, 2.0, -5.0, 3.0), tuple(j.slo_s for j in jobs), tuple(j.isolated_time_s for j in jobs),
    )
    failed = answer_admitted(
        AdmittedRequest("r", "max_min_fairness_perf", COUNTS, bad, (), packing=False), CONTEXT
    )
    assert not isinstance(failed, AdmittedAnswer)
    assert "jobs[2].time_since_arrival_s" in failed.reason and failed.refused_job_ids == (jobs[2].job_id,)


@pytest.mark.parametrize("policy", ["max_min_fairness_packed", "max_sum_throughput_perf"])
def test_the_reply_entries_are_the_json_writers(policy: str) -> None:
    """Packed pairs included, and solver noise (below NOISE_FRACTION) written as 0."""
    problem = problem_from_message(PolicyProblem(worker_types=COUNTS, jobs=_jobs(30, 4)), CONTEXT)
    allocation = REGISTRY.create(policy).allocate(problem)
    noisy = dataclasses.replace(allocation, job_fractions=allocation.job_fractions + 1e-9 * (allocation.job_fractions == 0))
    for a in (allocation, noisy):
        written = allocation_to_json(a)["allocation"]
        entries = computed_message("r", a).entries
        assert [(list(e.job_ids), dict(e.fractions)) for e in entries] == [(e["jobs"], e["fractions"]) for e in written]  # type: ignore[index, union-attr]
    assert any(len(e.job_ids) == 2 for e in computed_message("r", allocation).entries) == policy.endswith("_packed")


def test_plain_previous_entries_make_the_general_loops_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = [dataclasses.replace(j, steps_remaining=float(int(j.steps_remaining))) for j in random_jobs(12, 6)]
    previous = [
        AllocationEntry((jobs[0].id,), {"v100": 0.25, "k80": 0.5}),
        AllocationEntry((jobs[0].id,), {"v100": 0.5}),  # the same job twice: added in order
        AllocationEntry((jobs[3].id,), {"p100": -0.0, "k80": 1.0}),
        AllocationEntry(("gone",), {"v100": 1.0}),
    ]
    fast = build_problem(COUNTS, jobs, table=gavel_table(), previous=previous, prices_per_hour=PRICES)  # type: ignore[arg-type]
    assert fast.previous.job_fractions[0].tolist() == [0.75, 0.0, 0.5]
    monkeypatch.setattr(previous_module, "_previous_singles", lambda *args: None)
    general = build_problem(COUNTS, jobs, table=gavel_table(), previous=previous, prices_per_hour=PRICES)  # type: ignore[arg-type]
    assert fast == general
    assert np.array_equal(np.signbit(fast.previous.job_fractions), np.signbit(general.previous.job_fractions))


def test_a_previous_value_to_check_gets_the_checks_error() -> None:
    jobs = random_jobs(3, 7)
    with pytest.raises(Exception, match=r"previous_allocation\[0\].fractions.v100"):
        build_problem(COUNTS, jobs, table=gavel_table(), previous=[AllocationEntry((jobs[0].id,), {"v100": float("nan")})])  # type: ignore[list-item]


def test_only_a_policy_that_says_it_never_reads_the_last_allocation_goes_without_it() -> None:
    # (test_the_admitted_answer_is_the_messages holds the answers equal either way)
    assert not reads_previous("max_min_fairness_perf") and not reads_previous("max_min_fairness")
    assert reads_previous("max_min_fairness_packed")  # its column generation starts from the last pairs
    assert reads_previous("fifo") and reads_previous("gandiva")  # no claim: handed it
    assert reads_previous("no_such_policy") and reads_previous("max_min_fairness_perf", "no_such_preset")
