"""A job's ETA under the allocation in force (core/eta.py), worked by hand: type ``a`` runs
1/2/4 steps/s on k80/p100/v100; a pair runs its lower member at half its rate, the higher at a
quarter (builders.py)."""

from __future__ import annotations

from mechanism_service.core import eta
from tests.unit.mechanism.builders import state


def test_the_eta_is_the_remaining_steps_over_the_shares_times_the_rates():
    # j0: 1000 steps, v100 0.5 (4 steps/s) + k80 0.25 (1 step/s): 2.25 steps/s
    s = state(k80=1, v100=1).job("a", steps=1000).allocate((0,), v100=0.5, k80=0.25).build()
    got = eta.job_eta(s, s.jobs[0], 100.0)
    assert got.steps_per_s == 0.5 * 4 + 0.25 * 1
    assert got.finish_s == 100.0 + 1000 / 2.25
    assert got.soonest_s == 100.0 + 1000 / 4  # alone on the v100 all the time
    assert got.latest_s is None  # no step done yet: nothing bounds its wait
    assert "1000 steps left at 2.25 steps/s" in got.basis and "v100 0.50" in got.basis
    assert eta.finish_times(s, 100.0) == {"j0": got.finish_s}


def test_a_packed_entry_counts_at_the_jobs_packed_rate():
    # j0 alone on k80 0.5 (1 step/s), and packed with j1 on v100 0.5: j0 is the pair's lower
    # member, so 4 / 2 = 2 steps/s there; j1 the higher, 4 / 4 = 1
    s = state(k80=1, v100=1).packing().job("a", steps=900).job("a", steps=900).allocate((0,), k80=0.5).allocate((0, 1), v100=0.5).build()
    rates = eta.allocation_rates(s)
    assert rates == {0: 0.5 * 1 + 0.5 * 2, 1: 0.5 * 1}
    assert eta.job_eta(s, s.jobs[1], 0.0).finish_s == 900 / 0.5
    assert "packed" in eta.job_eta(s, s.jobs[0], 0.0).basis


def test_the_latest_bound_is_the_pace_it_has_kept_since_it_arrived():
    # 250 of 1000 steps in the 500 s since its arrival (it waited): 0.5 steps/s, against the
    # allocation's 4 x 0.5 = 2
    s = state(v100=1).job("a", steps=1000, arrival_s=0.0).done(0, 250).allocate((0,), v100=0.5).build()
    got = eta.job_eta(s, s.jobs[0], 500.0)
    assert got.finish_s == 500.0 + 750 / 2.0
    assert got.latest_s == 500.0 + 750 / 0.5
    assert got.soonest_s == 500.0 + 750 / 4.0
    assert eta.as_fields(got)["eta_range_s"] == [got.soonest_s, got.latest_s]


def test_no_share_no_estimate_and_why():
    s = state(v100=1).jobs(2).allocate((0,), v100=1.0).build()
    got = eta.job_eta(s, s.jobs[1], 0.0)
    assert (got.finish_s, got.latest_s, got.steps_per_s) == (None, None, 0.0)
    assert got.basis == "no estimate: the allocation in force gives it no share"
    assert got.soonest_s == 1000 / 4.0  # (what it could do alone is still known)
    assert "j1" not in eta.finish_times(s, 0.0)
    assert eta.as_fields(got)["eta_s"] is None


def test_a_share_where_it_cannot_run_gives_no_estimate():
    s = state(k80=1, v100=1).job("nok80").allocate((0,), k80=1.0).build()
    assert eta.job_eta(s, s.jobs[0], 0.0).basis == "no estimate: the mechanism knows no rate for it where its share is"


def test_the_eta_counts_from_when_the_steps_were_counted_so_it_stays_put_while_a_round_runs():
    # the steps done are as of the round's start (t=1000): the same ETA at t=1100 and t=1300
    s = state(v100=1).job("a", steps=10_000).done(0, 2000).allocate((0,), v100=1.0).build()
    at_1100 = eta.job_eta(s, s.jobs[0], 1100.0, since_s=1000.0)
    at_1300 = eta.job_eta(s, s.jobs[0], 1300.0, since_s=1000.0)
    assert at_1100.finish_s == at_1300.finish_s == 1000.0 + 8000 / 4.0
    assert at_1100.latest_s == 1000.0 + 8000 / (2000 / 1000.0)  # its pace until the steps were counted
    assert eta.finish_times(s, 1300.0, since_s=1000.0) == {"j0": 3000.0}
    # never in the past: a job whose last steps the running round does is due now
    assert eta.job_eta(s, s.jobs[0], 3500.0, since_s=1000.0).finish_s == 3500.0
