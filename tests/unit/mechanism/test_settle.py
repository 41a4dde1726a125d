"""settle_round: progress, time credit, completion, the gang failure path
(docs/gavel-semantics.md section 8)."""

from __future__ import annotations

from mechanism_service.core.model import EntryLedger
from mechanism_service.core.reducers import settle_round
from mechanism_service.core.rounds import RoundClock
from tests.unit.mechanism.builders import DEFAULT, GAVEL, GAVEL_PACKED, job_state, lease, state

KV = ("k80", "v100")


def test_steps_and_time_are_credited_and_a_job_with_no_steps_left_completes_at_its_finish():
    s = state(k80=1, v100=1).job("a", steps=1000).job("b", steps=500).type_time(k80=360.0, v100=360.0).settled().build()
    results = [
        lease((1,), "v100", (1,), (500,), 1200.0),
        lease((0,), "k80", (0,), (300,), 1359.5),
    ]

    done = settle_round(s, results, 1000.0, GAVEL)

    job1 = job_state(1, "b", types=KV, steps=500, steps_done=500, last_finish_s=1200.0, gpu_seconds={"v100": 200.0})
    assert done == [job1]
    assert s.completed == [job1]
    assert s.jobs == {
        0: job_state(0, types=KV, steps_done=300, last_finish_s=1359.5, gpu_seconds={"k80": 359.5}),
    }
    assert s.entries == {
        (0,): EntryLedger(
            {"k80": (1.0,), "v100": (4.0,)}, {"k80": 180.0 + 359.5, "v100": 180.0}, {"k80": 0.0, "v100": 0.0}
        )
    }
    # job 1's 200 s count on v100 although its ledger left with it: credit, then removal
    assert (s.type_time_s, s.needs_allocation) == ({"k80": 360.0 + 359.5, "v100": 360.0 + 200.0}, True)


def test_results_are_settled_latest_finish_first():
    s = state(k80=2).jobs(2, steps=100).build()
    results = [lease((0,), "k80", (0,), (100,), 1100.0), lease((1,), "k80", (1,), (100,), 1200.0)]

    done = settle_round(s, results, 1000.0, GAVEL)

    assert [j.index for j in done] == [1, 0]
    assert s.completed == done


def test_a_pair_credits_its_own_ledger_once_and_each_member_its_steps():
    s = state(k80=1).packing().job("a").job("b").type_time(k80=540.0).build()  # (0,), (1,), (0, 1)

    done = settle_round(s, [lease((0, 1), "k80", (0,), (90, 250), 1300.0)], 1000.0, GAVEL_PACKED)

    assert done == []
    assert {e: ledger.received_s for e, ledger in s.entries.items()} == {
        (0,): {"k80": 180.0},
        (1,): {"k80": 180.0},
        (0, 1): {"k80": 0.0 + 300.0},  # once for the pair, not per member or per single
    }
    assert s.type_time_s == {"k80": 540.0 + 300.0}
    assert s.jobs == {
        0: job_state(0, types=("k80",), steps_done=90, last_finish_s=1300.0, gpu_seconds={"k80": 150.0}),
        1: job_state(1, "b", types=("k80",), steps_done=250, last_finish_s=1300.0, gpu_seconds={"k80": 150.0}),
    }


def test_a_packed_job_completes_at_the_pairs_finish_and_its_partner_keeps_its_single():
    s = state(k80=1).packing().job("a", steps=100).job("b").type_time(k80=540.0).build()

    # job 0 needs 100 / 0.5 = 200 s, its partner sets the lease's end at 1300
    done = settle_round(s, [lease((0, 1), "k80", (0,), (100, 250), 1300.0)], 1000.0, GAVEL_PACKED)

    assert done == [
        job_state(0, types=("k80",), steps=100, steps_done=100, last_finish_s=1300.0, gpu_seconds={"k80": 150.0})
    ]
    assert list(s.entries) == [(1,)]
    assert s.type_time_s == {"k80": 840.0}


def test_a_gang_with_fewer_steps_than_gpus_fails_and_nothing_is_credited():
    s = (
        state(k80=4)
        .job(scale_factor=4, steps=1003)
        .done(0, 1000, gpu_seconds_by_type={"k80": 4000.0})
        .type_time(k80=180.0)
        .settled()
        .build()
    )

    done = settle_round(s, [lease((0,), "k80", (0, 1, 2, 3), (3,), 1001.0)], 1000.0, GAVEL)

    assert done == []
    assert s.jobs == {
        0: job_state(
            0, types=("k80",), scale_factor=4, steps=1003, steps_done=1000, failures=1, last_finish_s=1001.0,
            gpu_seconds={"k80": 4000.0},
        )
    }
    assert (s.entries[(0,)].received_s, s.type_time_s, s.needs_allocation) == ({"k80": 180.0}, {"k80": 180.0}, True)


def test_a_gang_is_dropped_at_its_fifth_consecutive_failure_without_a_completion_time():
    s = state(k80=4).job(scale_factor=4, steps=1003).done(0, 1000, failures=4).build()

    done = settle_round(s, [lease((0,), "k80", (0, 1, 2, 3), (3,), 1001.0)], 1000.0, GAVEL)

    dropped = job_state(0, types=("k80",), scale_factor=4, steps=1003, steps_done=1000, failures=5, last_finish_s=None)
    assert (done, s.completed, s.jobs, s.entries) == ([dropped], [dropped], {}, {})


def test_under_the_default_preset_a_gang_finishing_with_fewer_steps_than_gpus_completes():
    """Its last 3 steps on 4 GPUs were all it had left: not a failure (Gavel's preset drops it,
    above)."""
    s = state(k80=4).job(scale_factor=4, steps=1003).done(0, 1000, failures=4).build()

    done = settle_round(s, [lease((0,), "k80", (0, 1, 2, 3), (3,), 1001.0)], 1000.0, DEFAULT)

    assert [(j.job_id, j.steps_done, j.failures, j.last_finish_s) for j in done] == [(s.completed[0].job_id, 1003, 0, 1001.0)]
    assert s.jobs == {}


def test_a_successful_round_resets_the_failure_count():
    s = state(k80=4).job(scale_factor=4, steps=2000).done(0, 1000, failures=3).build()

    settle_round(s, [lease((0,), "k80", (0, 1, 2, 3), (400,), 1360.0)], 1000.0, GAVEL)

    assert (s.jobs[0].steps_done, s.jobs[0].failures, s.jobs[0].gpu_seconds_by_type) == (1400, 0, {"k80": 1440.0})


def test_a_failing_pair_of_gangs_counts_no_failures_but_asks_for_a_new_allocation():
    s = state(k80=2).packing().jobs(2, "b", scale_factor=2).settled().build()

    settle_round(s, [lease((0, 1), "k80", (0, 1), (1, 500), 1200.0)], 1000.0, GAVEL_PACKED)

    assert [(j.steps_done, j.failures) for j in s.jobs.values()] == [(0, 0), (0, 0)]
    assert (s.entries[(0, 1)].received_s, s.needs_allocation) == ({"k80": 0.0}, True)


def test_steps_done_and_not_credited_relaunch_the_entry_where_a_lease_of_no_steps_is_extended():
    """A pair whose partner did no step (its start-up outlasted the lease): the other's 250 steps
    are not credited. Extended, its process would go on from step 250 while the scheduler counts
    0, and the job would end 250 steps short of its checkpoints: the pair is launched afresh (from
    the newest checkpoint at or below what was credited). A lease that did no step at all is
    where the scheduler thinks it is, and is extended as planned."""
    s = state(k80=2).packing().job("a").job("b").job("c").settled().build()
    pair, alone = lease((0, 1), "k80", (0,), (0, 250), 1300.0), lease((2,), "k80", (1,), (0,), 1300.0)
    s.previous_assignment = {pair.entry: pair.placement, alone.entry: alone.placement}

    settle_round(s, [pair, alone], 1000.0, GAVEL_PACKED)

    assert [s.jobs[i].steps_done for i in (0, 1, 2)] == [0, 0, 0]
    assert s.previous_assignment == {alone.entry: alone.placement}


def test_a_lease_of_jobs_no_longer_active_is_ignored():
    s = state(k80=2).jobs(2).remove(1).settled().build()

    assert settle_round(s, [lease((1,), "k80", (1,), (10,), 1100.0)], 1000.0, GAVEL) == []
    assert (s.type_time_s, s.needs_allocation) == ({"k80": 0.0}, False)


def test_the_first_round_is_credited_from_0_in_gavel_and_from_its_dispatch_in_ours():
    """First arrival at t = 100: Gavel's stale round start puts the idle 100 s into the credit."""
    credited = {}
    for settings in (GAVEL, DEFAULT):
        s = state(k80=1).job(arrival_s=100.0).build()
        clock = RoundClock()
        clock.dispatched_at_s = 100.0
        settle_round(s, [lease((0,), "k80", (0,), (359,), 459.5)], clock.close(459.5, settings), settings)
        credited[settings.preset] = (s.entries[(0,)].received_s["k80"] - 180.0, s.jobs[0].gpu_seconds_by_type["k80"])

    assert credited == {"gavel": (459.5, 459.5), "default": (359.5, 359.5)}
