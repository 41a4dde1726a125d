"""A boundary's bookkeeping: lease accounting and open_round (docs/gavel-semantics.md section 6.3),
RoundClock (section 2), round_report (section 10)."""

from __future__ import annotations

from mechanism_service.core.model import Placement
from mechanism_service.core.planning.placement import count_extensions
from mechanism_service.core.rounds import RoundClock, RoundPlan, RoundReport, open_round, round_report
from tests.unit.mechanism.builders import DEFAULT, GAVEL, GAVEL_SHUFFLED, lease, no_shuffle, state


def no_shuffle(order: list[str]) -> None:
    raise AssertionError("this policy's type order is fixed")


def test_open_round_plans_places_and_counts_extensions_against_the_previous_round():
    s = (
        state(k80=3)
        .job("a")  # 0: highest share, ran on worker 0
        .job("nok80")  # 1: cannot run on k80, ran elsewhere last round: waits
        .job("a")  # 2: next share, placed afresh
        .job("a")  # 3: completed at this boundary
        .remove(3)
        .allocate((0,), k80=0.5)
        .allocate((1,), k80=0.1)
        .allocate((2,), k80=0.4)
        .type_time(k80=540.0)
        .ran((0,), "k80", 0)
        .ran((1,), "p100", 9)
        .ran((3,), "k80", 1)
        .build()
    )
    s.jobs[0].first_run_s = 0.0
    s.leases_extended, s.lease_opportunities = 4, 9

    plan = open_round(s, 1080.0, GAVEL, no_shuffle)

    assignment = {(0,): Placement("k80", (0,)), (2,): Placement("k80", (1,))}
    assert plan == RoundPlan(assignment, frozenset({(0,)}), extended=1, opportunities=2, jobs_waiting=1)
    assert list(plan.assignment) == [(0,), (2,)]
    assert (s.leases_extended, s.lease_opportunities, s.previous_assignment) == (5, 11, assignment)
    assert [j.first_run_s for j in s.jobs.values()] == [0.0, None, 1080.0]


def test_a_single_and_a_pair_on_the_same_workers_are_different_leases():
    s = state(k80=1).packing().jobs(2).ran((0, 1), "k80", 0).build()

    assert count_extensions(s, {(0,): Placement("k80", (0,))}) == (0, 1)


def test_an_agnostic_policy_shuffles_the_type_order_once_per_boundary_even_an_idle_one():
    orders: list[list[str]] = []

    def reverse(order: list[str]) -> None:
        orders.append(list(order))
        order.reverse()

    s = state(k80=1, v100=1).job("a").allocate((0,), k80=0.5, v100=0.5).type_time(k80=180.0, v100=180.0).build()

    shuffled = open_round(s, 0.0, GAVEL_SHUFFLED, reverse)
    fixed = open_round(s, 360.0, GAVEL, no_shuffle)
    idle = open_round(state(k80=1, v100=1).build(), 0.0, GAVEL_SHUFFLED, reverse)

    assert orders == [["v100", "k80"], ["v100", "k80"]]
    assert shuffled.assignment == {(0,): Placement("k80", (0,))}  # equal priorities: first type visited
    assert fixed.assignment == {(0,): Placement("v100", (1,))}
    assert idle == RoundPlan({}, frozenset(), 0, 0, 0)


def test_gavels_round_clock_credits_from_the_previous_rounds_end_and_from_0_at_first():
    clock = RoundClock()
    starts = []
    for dispatched_s, end_s in [(100.0, 459.5), (459.5, 819.0), (5000.0, 5359.5)]:  # idle 819 -> 5000
        clock.dispatched_at_s = dispatched_s
        starts.append(clock.close(end_s, GAVEL))

    assert starts == [0.0, 459.5, 819.0]  # the first round and the one after the gap are stale


def test_our_round_clock_credits_from_the_dispatch():
    clock = RoundClock()
    starts = []
    for dispatched_s, end_s in [(100.0, 459.5), (459.5, 819.0), (5000.0, 5359.5)]:
        clock.dispatched_at_s = dispatched_s
        starts.append(clock.close(end_s, DEFAULT))

    assert starts == [100.0, 459.5, 5000.0]


def test_round_report_counts_busy_gpus_and_gpu_seconds_per_type_and_the_jobs():
    s = state(k80=2, p100=1, v100=2).build()  # k80 0-1, p100 2, v100 3-4
    plan = RoundPlan({}, frozenset(), extended=2, opportunities=5, jobs_waiting=3)
    results = [
        lease((0,), "k80", (0, 1), (10,), 1350.0),  # a 2-GPU gang
        lease((1, 2), "v100", (3,), (5, 5), 1359.5),  # a pair on one GPU
        lease((3,), "v100", (4,), (7,), 1200.0),
    ]

    assert round_report(s, 7, 1000.0, plan, results, reset=True) == RoundReport(
        round_id=7,
        start_s=1000.0,
        end_s=1359.5,
        busy_gpus_by_type={"k80": 2, "p100": 0, "v100": 2},
        busy_gpu_seconds_by_type={"k80": 2 * 350.0, "p100": 0.0, "v100": 359.5 + 200.0},
        jobs_running=4,
        jobs_waiting=3,
        leases_extended=2,
        lease_opportunities=5,
        reset=True,
    )
