"""The mechanism on estimates: the book it keeps, the prior before any estimate, when a new
estimate is worth a new solve, the policy's input, and profiling runs within their share."""

from __future__ import annotations

import math

import pytest

from common.messages import (
    ColocationEstimate,
    JobThroughput,
    ProfileCell,
    ProfilingRequest,
    Provenance,
    StragglerFlag,
    ThroughputEstimated,
)
from common.throughputs import format_job_key, throughput_table_from_json
from mechanism_service.core.estimates import EstimateBook
from mechanism_service.core.learning import take_estimate
from mechanism_service.core.policy_input import allocation_request
from mechanism_service.core.profiling import choose
from mechanism_service.core.rates import EstimatedRates
from mechanism_service.core.reducers import NewJob, admit
from mechanism_service.core.model import new_state
from mechanism_service.core.rounds import open_round
from mechanism_service.core.settings import gavel_preset

# A reference table of two types (a, b) on two accelerator types; "b" cannot run on k80.
REFERENCE = throughput_table_from_json({
    "k80": {"('a', 1)": {"null": 1.0, "('a', 1)": [0.6, 0.6]}},
    "v100": {
        "('a', 1)": {"null": 4.0, "('a', 1)": [2.0, 2.0], "('b', 1)": [3.0, 6.0]},
        "('b', 1)": {"null": 8.0, "('a', 1)": [6.0, 3.0], "('b', 1)": [4.0, 4.0]},
    },
})
PACKED = gavel_preset("max_min_fairness_packed")
A, B, NEW = format_job_key("a", 1), format_job_key("b", 1), format_job_key("mine", 1)


def row(job_id: str, klass: str = "", **steps_per_s: float) -> JobThroughput:
    return JobThroughput(
        job_id, steps_per_s, dict.fromkeys(steps_per_s, Provenance.MEASURED), dict.fromkeys(steps_per_s, 0.9), klass
    )


def cluster(*jobs: tuple[str, str], book: EstimateBook | None = None, users=None):  # noqa: ANN001, ANN201
    """A k80=1, v100=2 cluster with jobs (id, type) admitted on estimated rates, packing."""
    book = book if book is not None else EstimateBook()
    rates = EstimatedRates(book, REFERENCE, users or {})
    s = new_state({"k80": 1, "v100": 2})
    for job_id, job_type in jobs:
        admit(s, NewJob(job_id, job_type, 1, 1000, 0.0), PACKED, rates)
    s.needs_allocation = False
    return s, book, rates


def test_the_prior_is_the_users_estimate_then_the_reference_then_the_typical_job():
    s, book, rates = cluster(("known", "a"), ("guessed", "mine"), ("unknown", "mine"), users={"guessed": {"v100": 9.0}})
    known, guessed, unknown = (s.jobs[i] for i in range(3))
    assert (rates.isolated(known, "v100"), rates.isolated(known, "k80")) == (4.0, 1.0)
    assert rates.isolated(guessed, "v100") == 9.0
    typical_v100 = math.sqrt(4.0 * 8.0)  # the geometric mean of the reference jobs of its size
    assert rates.isolated(unknown, "v100") == pytest.approx(typical_v100)
    assert rates.isolated(unknown, "k80") == pytest.approx(1.0)  # only "a" runs on k80
    bonly = NewJob("b-job", "b", 1, 10, 0.0)
    assert rates.isolated(bonly, "k80") == 0.0  # the reference knows b, and not on k80: it cannot run there
    # the estimator's word replaces every prior
    book.apply(ThroughputEstimated(jobs=(row("unknown", NEW, v100=5.0, k80=0.5),)))
    assert (rates.isolated(unknown, "v100"), rates.isolated(unknown, "k80")) == (5.0, 0.5)


def test_packed_rates_are_each_jobs_own_row_times_its_classes_fractions_either_way_round():
    s, book, rates = cluster(("x", "a"), ("y", "b"))
    x, y = s.jobs[0], s.jobs[1]
    assert rates.pair(x, y, "v100") == (3.0, 6.0)  # the reference's own pair, before any estimate
    book.apply(ThroughputEstimated(
        jobs=(row("x", A, v100=5.0), row("y", B, v100=10.0)),
        colocations=(ColocationEstimate((B, A), {"v100": (0.5, 0.25)}, {}, {}),),  # (b's, a's)
    ))
    assert rates.pair(x, y, "v100") == (5.0 * 0.25, 10.0 * 0.5)
    assert rates.pair(y, x, "v100") == (10.0 * 0.5, 5.0 * 0.25)
    assert rates.pair(x, y, "k80") == (0.0, 0.0)  # a type the estimate leaves out: they cannot share it


def test_a_late_estimate_for_a_job_that_left_is_dropped():
    book = EstimateBook()
    book.apply(ThroughputEstimated(jobs=(row("gone", A, v100=1.0),)), ended={"gone"})
    assert "gone" not in book.rows


def test_a_small_change_waits_for_the_next_solve_and_a_material_one_solves_again():
    s, book, rates = cluster(("x", "a"), ("y", "a"))
    before = dict(s.entries[(0,)].throughputs)
    assert not take_estimate(s, book, ThroughputEstimated(jobs=(row("x", A, v100=4.1, k80=1.0),)), rates)  # 2.5%
    assert s.entries[(0,)].throughputs == before and not s.needs_allocation
    assert take_estimate(s, book, ThroughputEstimated(jobs=(row("x", A, v100=4.4, k80=1.0),)), rates)  # 10%
    assert s.entries[(0,)].throughputs["v100"] == (4.4,) and s.needs_allocation
    s.needs_allocation = False
    # a pair measured unable to share a type: always material, and its ledger says so at once
    pair = ColocationEstimate((A, A), {"k80": (0.6, 0.6), "v100": (0.0, 0.0)}, {}, {})
    assert take_estimate(s, book, ThroughputEstimated(colocations=(pair,)), rates)
    assert s.entries[(0, 1)].throughputs["v100"] == (0.0, 0.0)


def test_the_policy_gets_each_jobs_row_and_the_fractions_of_its_classes():
    s, book, rates = cluster(("x", "a"), ("y", "mine"))
    request = allocation_request(
        s, 10.0, request_id="r", policy="max_min_fairness_packed", deadline_s=1e9, packing=True, rates=rates
    )
    jobs = {j.job_id: j for j in request.problem.jobs}
    assert jobs["x"].throughputs_steps_per_s == {"k80": 1.0, "v100": 4.0}
    assert jobs["y"].colocation_class == NEW and jobs["x"].colocation_class == A
    # the reference's fractions for (a, a); nothing yet for the new class (not packed until estimated)
    assert [(c.classes, dict(c.fractions)) for c in request.problem.colocations] == [
        ((A, A), {"k80": (0.6, 0.6), "v100": (0.5, 0.5)})
    ]


def test_profiling_runs_stay_within_their_share_and_alone_cells_come_first():
    book = EstimateBook()
    # the estimator's prior for the new class packed with a (without one, the pair cannot share)
    book.apply(ThroughputEstimated(colocations=(ColocationEstimate((A, NEW), {"v100": (0.7, 0.7)}, {}, {}),)))
    s, book, rates = cluster(("new", "mine"), ("ref", "a"), book=book)
    request = ProfilingRequest("new", (ProfileCell("k80"), ProfileCell("v100", A)), packed_wanted=1)
    picks_by_round = []
    for _ in range(6):
        picks_by_round.append(choose(s, {"new": request}, 0.1, packing=True))
    # 3 GPUs x 0.1 = 0.3 GPU-rounds a round: a one-GPU run every few rounds, never two in a row
    taken = [p for picks in picks_by_round for p in picks]
    assert [len(p) for p in picks_by_round] == [0, 0, 0, 1, 0, 0]
    assert taken[0].entry == (0,) and taken[0].accelerator_type == "k80"  # alone first
    later = [p for _ in range(3) for p in choose(s, {"new": request}, 0.1, packing=True)]
    assert [(p.entry, p.accelerator_type) for p in later] == [((0, 1), "v100")]  # with a job of class a
    assert all(not choose(s, {"new": request}, 1.0, packing=True) for _ in range(3))  # each cell once
    assert s.profiling.leases == 2 and s.profiling.gpu_rounds == 2


def test_packed_cells_need_a_policy_that_packs():
    s, _, _ = cluster(("new", "mine"), ("ref", "a"))
    request = ProfilingRequest("new", (ProfileCell("v100", A),), packed_wanted=1)
    assert choose(s, {"new": request}, 1.0, packing=False) == []


def test_a_profiling_run_is_placed_even_where_the_allocation_gives_nothing():
    s, _, _ = cluster(("new", "mine"), ("ref", "a"))
    s.allocation = {(1,): {"v100": 1.0}, (0,): {}}
    picks = choose(s, {"new": ProfilingRequest("new", (ProfileCell("k80"),))}, 1.0, packing=True)
    plan = open_round(s, 0.0, PACKED, lambda order: None, picks)
    assert plan.assignment[(0,)].accelerator_type == "k80" and plan.profiled == frozenset({(0,)})
    assert plan.assignment[(1,)].accelerator_type == "v100"  # the rest is planned as usual


def test_straggler_flags_come_and_go():
    book = EstimateBook()
    book.apply(ThroughputEstimated(stragglers=(StragglerFlag("w1", 0.5, 3),)))
    assert book.stragglers["w1"].ratio == 0.5
    book.apply(ThroughputEstimated(stragglers=(StragglerFlag("w1", 0.9, 4, flagged=False),)))
    assert not book.stragglers


def test_gavel_workers_shows_a_flagged_straggler(capsys):
    from mechanism_service.core.status import workers_report
    from services.cli.status_cmd import print_workers

    rows = workers_report(None, {"v100": [("v100-0", 1), ("v100-1", 1)]}, stragglers={"v100-1": StragglerFlag("v100-1", 0.55, 4)})
    assert "straggler" not in rows[0] and rows[1]["straggler"] == {"speed_vs_predicted": 0.55, "jobs": 4}
    print_workers(rows)
    lines = capsys.readouterr().out.splitlines()
    assert "straggler" in lines[0] and "0.55x predicted over 4 jobs" in lines[-1]


def test_a_mechanism_on_estimates_accepts_a_job_type_no_table_knows():
    from common.messages import JobSpec, JobSubmitted
    from mechanism_service.core.intake import Intake, receive
    from mechanism_service.core.rates import TableRates

    message = JobSubmitted(JobSpec("mine", "my-model (batch size 7)", 100))
    _, _, estimated = cluster()
    assert receive(Intake(), message, 0.0, lockstep=False, rates=estimated, types=("v100",)).outcome == "new"
    refused = receive(Intake(), message, 0.0, lockstep=False, rates=TableRates.of(REFERENCE), types=("v100",))
    assert refused.outcome == "refused" and "unknown job type" in refused.reason


def test_a_complete_picture_withdraws_the_requests_and_flags_it_leaves_out():
    book = EstimateBook()
    book.apply(ThroughputEstimated(
        profiling=(ProfilingRequest("x", (ProfileCell("v100"),)),), stragglers=(StragglerFlag("w1", 0.5, 3),),
    ))
    changes = book.apply(ThroughputEstimated(jobs=(row("x", A, v100=1.0),), complete=True))
    assert not book.profiling and not book.stragglers and changes.requests == {"x"}
