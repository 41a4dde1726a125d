"""build_problem(admitted=True): the problem of jobs the caller admitted itself is the problem
the job-by-job checks build, value for value; anything the shortcut does not cover, and any value
out of range, goes through those checks, so the errors are theirs."""

from __future__ import annotations

import dataclasses

import pytest

from common.errors import ProblemError
from policy_service.core import AllocationEntry, Entity, JobSpec, build_problem, validation
from tests.unit.policy.builders import PRICES, gavel_table, random_jobs

COUNTS = {"v100": 8, "p100": 8, "k80": 8}


def _simulator_jobs(n: int, seed: int) -> list[JobSpec]:
    """Jobs as the simulator's requests carry them: no throughputs, integer steps left."""
    return [
        dataclasses.replace(job, steps_remaining=int(job.steps_remaining), isolated_time_s=10.0 * i, slo_s=None, entity=None)
        for i, job in enumerate(random_jobs(n, seed))
    ]


def _both(jobs: list[JobSpec], **kwargs: object):  # noqa: ANN202
    return (
        build_problem(COUNTS, jobs, table=gavel_table(), **kwargs),  # type: ignore[arg-type]
        build_problem(COUNTS, jobs, table=gavel_table(), admitted=True, **kwargs),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("n,seed", [(1, 0), (18, 1), (39, 2), (120, 3)])
@pytest.mark.parametrize("pairs", [(), None])  # no packing; packing from the table
def test_the_admitted_problem_is_the_checked_one(
    n: int, seed: int, pairs: tuple | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = _simulator_jobs(n, seed)
    previous = [AllocationEntry((job.id,), {"v100": 0.25, "k80": 0.5}) for job in jobs[::2]]
    kwargs = {"pairs": pairs, "previous": previous, "prices_per_hour": PRICES, "policy_state": "s"}
    checked = build_problem(COUNTS, jobs, table=gavel_table(), **kwargs)  # type: ignore[arg-type]

    def no_checks(*args: object) -> None:
        raise AssertionError("the admitted jobs went through the job-by-job checks")

    monkeypatch.setattr(validation, "_checked_columns", no_checks)
    admitted = build_problem(COUNTS, jobs, table=gavel_table(), admitted=True, **kwargs)  # type: ignore[arg-type]
    assert admitted == checked  # every array, value for value (Problem.__eq__)


def test_a_value_out_of_range_gets_the_checked_error() -> None:
    jobs = _simulator_jobs(5, 4)
    jobs[3] = dataclasses.replace(jobs[3], time_since_arrival_s=2e10)
    with pytest.raises(ProblemError, match=r"jobs\[3\].time_since_arrival_s") as caught:
        build_problem(COUNTS, jobs, table=gavel_table(), admitted=True)
    assert caught.value.job_ids == (jobs[3].id,)


def test_a_job_that_cannot_run_gets_the_checked_error() -> None:
    jobs = _simulator_jobs(5, 5)
    jobs[2] = dataclasses.replace(jobs[2], scale_factor=16)  # more than any type has
    with pytest.raises(ProblemError, match=r"jobs\[2\].scale_factor"):
        build_problem(COUNTS, jobs, table=gavel_table(), admitted=True)


def test_a_repeated_id_gets_the_checked_error() -> None:
    jobs = _simulator_jobs(4, 6)
    jobs[3] = dataclasses.replace(jobs[3], id=jobs[1].id)
    with pytest.raises(ProblemError, match=r"jobs\[3\].id: duplicate"):
        build_problem(COUNTS, jobs, table=gavel_table(), admitted=True)


def test_inputs_beyond_the_simulators_take_the_checks() -> None:
    jobs = _simulator_jobs(6, 7)
    with_own = [dataclasses.replace(jobs[0], throughputs_steps_per_s={"v100": 2.0, "p100": 1.0, "k80": 0.5}), *jobs[1:]]
    checked, admitted = _both(with_own, pairs=())
    assert admitted == checked
    with_entity = [dataclasses.replace(job, entity="a") for job in jobs]
    checked, admitted = _both(with_entity, pairs=(), entities=[Entity("a")])
    assert admitted == checked
    bad_class = [dataclasses.replace(jobs[0], colocation_class=None), *jobs[1:]]  # type: ignore[arg-type]
    with pytest.raises(ProblemError, match=r"jobs\[0\].colocation_class"):
        build_problem(COUNTS, bad_class, table=gavel_table(), admitted=True)


@pytest.mark.parametrize(
    "field,value",
    [
        ("steps_remaining", float("nan")), ("steps_remaining", -1), ("steps_remaining", 10**13),
        ("time_since_arrival_s", float("inf")), ("isolated_time_s", -0.5),
        ("attained_service_gpu_s", float("nan")), ("last_run_s", 1e11),
    ],
)
def test_a_value_the_shortcut_cannot_vouch_for_gets_the_checked_error(field: str, value: float) -> None:
    jobs = _simulator_jobs(6, 8)
    jobs[4] = dataclasses.replace(jobs[4], **{field: value})
    with pytest.raises(ProblemError) as checked:
        build_problem(COUNTS, jobs, table=gavel_table())
    with pytest.raises(ProblemError) as admitted:
        build_problem(COUNTS, jobs, table=gavel_table(), admitted=True)
    assert str(admitted.value) == str(checked.value) and f"jobs[4].{field}" in str(admitted.value)


def test_whether_a_job_runs_is_asked_again_of_another_cluster() -> None:
    table = gavel_table()
    jobs = [dataclasses.replace(job, scale_factor=4) for job in _simulator_jobs(3, 9) if table.has_job(job.job_type, 4)]
    assert jobs
    build_problem(COUNTS, jobs, table=table, admitted=True)  # every type has 8 GPUs: they run
    with pytest.raises(ProblemError, match=r"jobs\[0\].scale_factor"):
        build_problem({"v100": 2, "p100": 2, "k80": 2}, jobs, table=table, admitted=True)


def test_counts_of_another_kind_than_ints_are_checked_though_the_cluster_was_seen() -> None:
    jobs = [job for job in _simulator_jobs(6, 10) if job.scale_factor == 1]
    assert jobs
    build_problem({"v100": 1, "p100": 1, "k80": 1}, jobs, table=gavel_table(), admitted=True)
    with pytest.raises(ProblemError, match=r"worker_types.v100"):
        build_problem({"v100": True, "p100": 1, "k80": 1}, jobs, table=gavel_table(), admitted=True)
    problem = build_problem({"v100": 2, "p100": 1, "k80": 1}, jobs, table=gavel_table(), admitted=True)
    assert problem.worker_counts.tolist() == [2.0, 1.0, 1.0] and not problem.worker_counts.flags.writeable
