"""The snapshot sent to the policy and the answer read back (docs/gavel-semantics.md section 9.1)."""

from __future__ import annotations

import numpy as np
import pytest

from common.errors import ProblemError
from common.messages import AllocationComputed, AllocationEntry, AllocationRequested, EntitySpec, PolicyJob, PolicyProblem
from common.messages.allocation import SolveStatus
from mechanism_service.core.job_entries import withdraw_job
from mechanism_service.core.model import Placement
from mechanism_service.core.policy_input import (
    admitted_snapshot,
    allocation_fractions,
    allocation_request,
    previous_columns,
    previous_entries,
    runnable_jobs,
    runs_here,
    service_of,
)
from mechanism_service.core.settle import record_first_runs
from policy_service.core.previous import previous_allocation
from tests.unit.mechanism.builders import state


def test_the_request_snapshots_active_jobs_and_the_nonzero_allocation_of_active_entries():
    s = (
        state(k80=2, v100=1)
        .packing()
        .job("a", steps=1000, arrival_s=100.0, weight=2.0, slo_s=5000.0, entity="team-a")
        .job("b", steps=300, arrival_s=250.0)
        .job("c", arrival_s=300.0)
        .remove(2)
        .done(0, 400, isolated_time_s=12.5)
        .allocate((0,), k80=0.5, v100=0.0)
        .allocate((1,), k80=0.0, v100=0.0)  # all zero: not a previous allocation
        .allocate((0, 1), v100=0.25)
        .allocate((2,), k80=1.0)  # stale: job 2 has left
        .allocate((0, 2), k80=0.5)
        .build()
    )
    s.policy_state = "continuation"

    request = allocation_request(
        s, 1000.0, request_id="r3", policy="max_min_fairness_packed", deadline_s=30.0, preset="gavel", seed=3,
        solver="ECOS", packing=True,
    )

    assert request == AllocationRequested(
        request_id="r3",
        policy="max_min_fairness_packed",
        problem=PolicyProblem(
            worker_types={"k80": 2, "v100": 1},
            pairs=None,  # packing: the policy service takes every packable pair from its table
            jobs=(
                # (neither ran yet: the time since its last run is the time since its arrival)
                PolicyJob(
                    "j0", "a", 1, 2.0, 600, 900.0, slo_s=5000.0, entity="team-a", isolated_time_s=12.5,
                    time_since_last_run_s=900.0,
                ),
                PolicyJob("j1", "b", 1, 1.0, 300, 750.0, time_since_last_run_s=750.0),
            ),
            previous=(
                AllocationEntry(("j0",), {"k80": 0.5, "v100": 0.0}),
                AllocationEntry(("j0", "j1"), {"v100": 0.25}),
            ),
            entities=(EntitySpec("team-a"),),  # each entity a job names, so the policy knows it
        ),
        deadline_s=30.0,
        solver="ECOS",
        preset="gavel",
        seed=3,
        policy_state="continuation",
    )


def test_a_policy_that_does_not_pack_is_sent_no_pairs_and_the_defaults():
    s = state(k80=1).job("a", arrival_s=10.0).build()

    assert allocation_request(s, 10.0, request_id="r0", policy="fifo", deadline_s=1.0) == AllocationRequested(
        request_id="r0",
        policy="fifo",
        problem=PolicyProblem(worker_types={"k80": 1}, jobs=(PolicyJob("j0", "a", 1, 1.0, 1000, 0.0),), pairs=()),
        deadline_s=1.0,
        solver=None,
        preset="default",
        seed=None,
        policy_state="",
    )


def test_the_reply_is_read_as_job_id_tuples_to_fractions():
    reply = AllocationComputed(
        request_id="r3",
        policy="max_min_fairness_packed",
        status=SolveStatus.OPTIMAL,
        objective=1.0,
        solve_time_s=0.1,
        entries=(AllocationEntry(("j0",), {"k80": 0.5}), AllocationEntry(("j0", "j1"), {"v100": 0.25})),
    )

    assert allocation_fractions(reply) == {("j0",): {"k80": 0.5}, ("j0", "j1"): {"v100": 0.25}}


def test_the_admitted_snapshot_is_the_requests_jobs_column_by_column():
    s = (
        state(k80=2, v100=1)
        .job("a", steps=1000, arrival_s=100.0, weight=2.0, slo_s=5000.0)
        .job("b", steps=300, arrival_s=250.0)
        .job("c", arrival_s=300.0)
        .remove(2)
        .done(0, 400, isolated_time_s=12.5)
        .allocate((0,), k80=0.5, v100=0.0)
        .allocate((1,), k80=0.0, v100=0.0)  # all zero: not sent
        .allocate((0, 1), v100=0.25)
        .allocate((2,), k80=1.0)  # stale: job 2 has left
        .build()
    )
    request = allocation_request(s, 1000.0, request_id="r", policy="max_min_fairness_perf", deadline_s=1.0)

    worker_types, columns, previous = admitted_snapshot(s, 1000.0)

    fields = ("job_id", "job_type", "scale_factor", "priority_weight", "steps_remaining", "time_since_arrival_s",
              "slo_s", "isolated_time_s", "attained_service_gpu_s", "time_since_last_run_s", "last_run_s")
    assert columns == tuple(tuple(getattr(job, name) for job in request.problem.jobs) for name in fields)
    assert columns[0] == ("j0", "j1") and columns[4] == (600, 300)
    assert worker_types == request.problem.worker_types
    # the request's entries as arrays (previous_columns), 0.0 for a type an entry does not name
    assert previous and [(e.job_ids, {w: v for w, v in e.fractions.items() if v}) for e in previous.entries()] == [
        (e.job_ids, {w: v for w, v in e.fractions.items() if v}) for e in request.problem.previous
    ]
    # for a policy that never reads it: the same jobs, no allocation in force
    assert admitted_snapshot(s, 1000.0, with_previous=False) == (worker_types, columns, ())
    # for a policy that never reads what the jobs ran: the first eight columns only
    assert admitted_snapshot(s, 1000.0, with_service=False)[:2] == (worker_types, columns[:8])


def test_the_previous_columns_make_the_problem_the_entries_make():
    """Singles and pairs, entries of jobs gone or not runnable, all-zero entries, either source
    of the shares (the ledgers' copy of the allocation in force, or its dicts)."""
    s = (
        state(k80=2, v100=1)
        .packing()
        .job("a", steps=1000, arrival_s=100.0)
        .job("b", steps=300, arrival_s=250.0)
        .job("c", arrival_s=300.0)
        .job("nok80", arrival_s=310.0)
        .remove(2)
        .allocate((0,), k80=0.5, v100=0.0)
        .allocate((1,), k80=0.0, v100=0.0)
        .allocate((3,), v100=0.125)
        .allocate((0, 1), v100=0.25)
        .allocate((1, 3), k80=0.375, v100=-0.0)
        .allocate((2,), k80=1.0)
        .allocate((0, 2), k80=0.5)
        .build()
    )
    entries = previous_entries(s)
    for mirrored in (False, True):
        if mirrored:
            s.entries.allocation_matrix(s.allocation)
        arrays = previous_columns(s)
        assert len(arrays) == len(entries)
        for index in ({"j0": 0, "j1": 1, "j3": 2}, {"j1": 0, "j3": 1}, {}):
            made = previous_allocation(arrays, index, ("k80", "v100", "p100"))
            expected = previous_allocation(entries, index, ("k80", "v100", "p100"))
            for name in ("job_fractions", "pair_jobs", "pair_fractions"):
                got, want = getattr(made, name), getattr(expected, name)
                assert got.dtype == want.dtype and got.shape == want.shape and got.tolist() == want.tolist(), name
                assert np.array_equal(np.signbit(got), np.signbit(want)), name
    with pytest.raises(ProblemError, match="v100: not a worker type"):
        previous_allocation(previous_columns(s), {"j0": 0}, ("k80",))


def test_a_job_with_an_entity_is_left_to_the_request():
    s = state(k80=1).job("a", arrival_s=10.0, entity="team-a").build()
    assert admitted_snapshot(s, 10.0) is None


def test_what_each_job_ran_is_read_from_its_uninterrupted_runs():
    # One v100, rounds of 360 s. Job 0 runs rounds [0, 360) and [360, 720) (one run of 720 s),
    # waits [720, 1080) and runs again [1080, 1440): its last run is 360 s, its latest began at
    # 1080. Job 1 never runs. Read at 1800 s: job 0 ended its last run 360 s ago.
    s = state(v100=1).job("a", arrival_s=0.0).job("a", arrival_s=100.0).build()
    v100 = Placement("v100", (0,))
    for start_s, ran in ((0.0, True), (360.0, True), (720.0, False), (1080.0, True)):
        record_first_runs(s, {(0,): v100} if ran else {}, start_s, continues_within_s=180.0)
        if ran:
            s.jobs[0].last_finish_s = start_s + 360.0
            s.jobs[0].gpu_seconds_by_type["v100"] += 360.0
    assert s.run_started_s == {0: 1080.0}
    assert service_of(s, s.jobs[0], 1800.0) == (1080.0, 360.0, 360.0)
    assert service_of(s, s.jobs[1], 1800.0) == (0.0, 1700.0, 0.0)  # since its arrival
    # Sent as the request's fields, and forgotten with the job
    request = allocation_request(s, 1800.0, request_id="r", policy="tiresias_perf", deadline_s=1.0)
    assert [(j.attained_service_gpu_s, j.time_since_last_run_s, j.last_run_s) for j in request.problem.jobs] == [
        (1080.0, 360.0, 360.0), (0.0, 1700.0, 0.0)
    ]
    withdraw_job(s, 0)
    assert s.run_started_s == {}


def test_the_jobs_sent_are_those_some_type_here_runs_in_admission_order():
    # A cluster that lost workers: 2 k80s and 1 v100 left, so a 4-GPU gang fits nowhere, a
    # 2-GPU one only on k80, where "nok80" has no throughput.
    s = (
        state(k80=2, v100=1)
        .job("a")
        .job("a", scale_factor=4)
        .job("nok80", scale_factor=2)
        .job("nok80")
        .job("b", scale_factor=2)
        .remove(0)
        .build()
    )

    sent = runnable_jobs(s)

    assert [job.job_id for job in sent] == ["j3", "j4"]
    assert sent == [job for job in s.jobs.values() if runs_here(s, job.index)]
    assert runnable_jobs(state(k80=1).build()) == []
