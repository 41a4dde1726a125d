"""The snapshot sent to the policy and the answer read back (docs/gavel-semantics.md section 9.1)."""

from __future__ import annotations

from common.messages import AllocationComputed, AllocationEntry, AllocationRequested, EntitySpec, PolicyJob, PolicyProblem
from common.messages.allocation import SolveStatus
from mechanism_service.core.policy_input import admitted_snapshot, allocation_fractions, allocation_request
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
                PolicyJob("j0", "a", 1, 2.0, 600, 900.0, slo_s=5000.0, entity="team-a", isolated_time_s=12.5),
                PolicyJob("j1", "b", 1, 1.0, 300, 750.0),
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
              "slo_s", "isolated_time_s")
    assert columns == tuple(tuple(getattr(job, name) for job in request.problem.jobs) for name in fields)
    assert columns[0] == ("j0", "j1") and columns[4] == (600, 300)
    assert worker_types == request.problem.worker_types
    assert previous == request.problem.previous and previous
    # for a policy that never reads it: the same jobs, no allocation in force
    assert admitted_snapshot(s, 1000.0, with_previous=False) == (worker_types, columns, ())


def test_a_job_with_an_entity_is_left_to_the_request():
    s = state(k80=1).job("a", arrival_s=10.0, entity="team-a").build()
    assert admitted_snapshot(s, 10.0) is None
