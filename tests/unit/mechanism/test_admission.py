"""admit and remove_job (docs/gavel-semantics.md section 3)."""

from __future__ import annotations

import dataclasses

import copy
from dataclasses import replace

import pytest

from mechanism_service.core.model import EntryLedger
from mechanism_service.core.rates import TableRates
from mechanism_service.core.reducers import Admission, NewJob, admission, admit, remove_job
from mechanism_service.core.rounds import admit_arrivals
from tests.unit.mechanism.builders import GAVEL, GAVEL_PACKED, RATES, isolated, job_state, pair, state

KV = ("k80", "v100")


def single(k80: float, v100: float) -> EntryLedger:
    """A single job's ledger as admitted: its isolated throughputs, 180 s received, no deficit."""
    return EntryLedger({"k80": (k80,), "v100": (v100,)}, {"k80": 180.0, "v100": 180.0}, {"k80": 0.0, "v100": 0.0})


def paired(k80: tuple[float, float], v100: tuple[float, float]) -> EntryLedger:
    """A pair's ledger as created: (lower index's, higher index's) steps/s, 0 s received."""
    return EntryLedger({"k80": k80, "v100": v100}, {"k80": 0.0, "v100": 0.0}, {"k80": 0.0, "v100": 0.0})


def admit_all(s, settings, *jobs: tuple[str, int]):
    for job_type, scale_factor in jobs:
        admit(s, NewJob(f"j{s.next_index}", job_type, scale_factor, 1000, 0.0), settings, RATES)


def test_packing_inserts_the_single_then_pairs_with_earlier_jobs_of_the_same_scale_factor():
    s = state(k80=1, v100=1).build()

    admit_all(s, GAVEL_PACKED, ("a", 1), ("b", 2), ("c", 1), ("a", 1), ("b", 2))

    assert list(s.entries.items()) == [
        ((0,), single(1.0, 4.0)),
        ((1,), single(20.0, 80.0)),  # b with 2 GPUs: the gang's throughput
        ((2,), single(100.0, 400.0)),
        ((0, 2), paired((0.5, 25.0), (2.0, 100.0))),  # pair(a, c): job 0's rate first
        ((3,), single(1.0, 4.0)),
        ((0, 3), paired((0.5, 0.25), (2.0, 1.0))),
        ((2, 3), paired((50.0, 0.25), (200.0, 1.0))),  # pair(c, a): job 2 (type c) is the lower index
        ((4,), single(20.0, 80.0)),
        ((1, 4), paired((10.0, 5.0), (40.0, 20.0))),  # only with job 1, the other 2-GPU job
    ]


def test_without_packing_only_single_entries_exist():
    s = state(k80=1, v100=1).build()

    admit_all(s, GAVEL, ("a", 1), ("a", 1), ("b", 1))

    assert list(s.entries.items()) == [((0,), single(1.0, 4.0)), ((1,), single(1.0, 4.0)), ((2,), single(10.0, 40.0))]


def test_admit_numbers_the_job_flags_a_change_and_leaves_the_type_totals_alone():
    s = state(k80=1, v100=1).job("a").type_time(k80=540.0, v100=900.0).settled().build()

    record = admit(s, NewJob("x", "b", 1, 700, 42.0, 2.0, 9000.0, "team"), GAVEL, RATES)

    assert record == replace(
        job_state(1, "b", types=KV, steps=700, arrival_s=42.0),
        job_id="x",
        priority_weight=2.0,
        slo_s=9000.0,
        entity="team",
    )
    assert s.jobs == {0: job_state(0, types=KV), 1: record}
    assert (s.next_index, s.needs_allocation, s.type_time_s) == (2, True, {"k80": 540.0, "v100": 900.0})


def test_a_pair_the_table_does_not_list_gets_zero_throughputs():
    s = state(k80=1, v100=1).build()

    def only_on_v100(lo: str, hi: str, scale_factor: int, w: str):
        return pair(lo, hi, scale_factor, w) if w == "v100" else None

    for job_type in ("a", "b"):
        admit(s, NewJob(f"j{s.next_index}", job_type, 1, 10, 0.0), GAVEL_PACKED, TableRates(isolated, only_on_v100))

    assert s.entries[(0, 1)] == paired((0.0, 0.0), (2.0, 10.0))


def test_remove_job_drops_its_single_and_every_pair_with_it_and_keeps_the_order_of_the_rest():
    s = state(k80=1, v100=1).packing().jobs(4).allocate((1,), k80=1.0).allocate((0, 1), v100=1.0).settled().build()
    s.jobs[1].last_finish_s = 700.0
    assert list(s.entries) == [(0,), (1,), (0, 1), (2,), (0, 2), (1, 2), (3,), (0, 3), (1, 3), (2, 3)]
    rest = [(e, copy.deepcopy(ledger)) for e, ledger in s.entries.items() if 1 not in e]
    allocation = copy.deepcopy(s.allocation)

    record = remove_job(s, 1)

    assert record == job_state(1, types=KV, last_finish_s=700.0)
    assert list(s.entries.items()) == rest  # (0,), (2,), (0, 2), (3,), (0, 3), (2, 3)
    assert list(s.jobs) == [0, 2, 3]
    assert s.completed == [record]
    assert s.needs_allocation is True
    assert s.allocation == allocation  # stale keys are harmless and stay until the next solve


def test_a_dropped_job_leaves_without_a_completion_time():
    s = state(k80=1).job("a").build()
    s.jobs[0].last_finish_s = 700.0

    record = remove_job(s, 0, dropped=True)

    assert record == job_state(0, types=("k80",), last_finish_s=None)
    assert (s.entries, s.jobs, s.completed) == ({}, {}, [record])


@pytest.mark.parametrize(
    ("job_type", "scale_factor", "steps", "problem"),
    [
        ("a", 2, 10, ""),
        ("nok80", 1, 10, ""),  # runs on v100
        ("a", 1, 0, "total_steps: must be >= 1, got 0"),
        ("a", 0, 10, "scale_factor: must be >= 1, got 0"),
        ("a", 4, 10, "needs 4 GPUs of one accelerator type where 'a' runs (here: k80 3, v100 2)"),
        ("nok80", 3, 10, "needs 3 GPUs of one accelerator type where 'nok80' runs (here: v100 2)"),
        ("zzz", 1, 10, "'zzz'"),  # the lookup's own error names the unknown type
    ],
)
def test_admission_names_why_a_job_can_never_run(job_type, scale_factor, steps, problem):
    gpus = {"k80": 3, "v100": 2}

    verdict = admission(gpus, NewJob("x", job_type, scale_factor, steps, 0.0), RATES)

    assert verdict.verdict == ("refuse" if problem else "admit")
    assert problem in verdict.reason and bool(verdict.reason) == bool(problem)


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("priority_weight", 0.0, "priority_weight: must be >= 0.001, got 0"),
        ("priority_weight", float("nan"), "priority_weight: NaN is not allowed"),
        ("slo_s", -10.0, "slo_s: must be > 0, got -10"),
        ("slo_s", float("inf"), "slo_s: must be finite, got inf"),
        ("entity", "", "entity: must not be empty"),
        ("job_id", "a b", "job_id: must be printable, without spaces, got 'a b'"),
        ("total_steps", 10**13, "total_steps: must be <= 1000000000000, got 10000000000000"),
    ],
)
def test_admission_refuses_every_field_the_policy_would_refuse(field, value, reason):
    job = dataclasses.replace(NewJob("x", "a", 1, 10, 0.0), **{field: value})

    assert admission({"k80": 3}, job, RATES) == Admission("refuse", reason)


def test_admit_arrivals_admits_the_runnable_in_order_and_returns_the_others_with_reasons():
    s = state(k80=2).build()
    jobs = [NewJob("x", "a", 1, 10, 0.0), NewJob("y", "nok80", 1, 10, 0.0), NewJob("z", "b", 2, 10, 0.0)]

    others = admit_arrivals(s, jobs, GAVEL, RATES)

    assert others == [(jobs[1], Admission("refuse", "'nok80' on 1 GPUs runs on no accelerator type here"))]
    assert [(j.index, j.job_id) for j in s.jobs.values()] == [(0, "x"), (1, "z")]


def test_an_elastic_cluster_holds_jobs_that_may_fit_later_and_refuses_jobs_that_never_can():
    table_types = ("k80", "v100")
    empty: dict[str, int] = {}
    held = admission(empty, NewJob("x", "nok80", 1, 10, 0.0), RATES, elastic_types=table_types)
    assert held == Admission(
        "hold", "needs 1 GPU of one accelerator type where 'nok80' runs, and there is none here: "
        "it waits for workers to join",
    )
    gang = admission({"k80": 1}, NewJob("x", "a", 4, 10, 0.0), RATES, elastic_types=table_types)
    assert gang.verdict == "hold" and "(here: k80 1)" in gang.reason
    assert admission({"k80": 4}, NewJob("x", "a", 4, 10, 0.0), RATES, elastic_types=table_types).verdict == "admit"
    unknown = admission(empty, NewJob("x", "zzz", 1, 10, 0.0), RATES, elastic_types=table_types)
    assert unknown.verdict == "refuse" and "'zzz'" in unknown.reason


def test_a_server_joining_adds_gpus_and_a_ledger_for_its_new_type():
    from mechanism_service.core.reducers import add_server

    s = state(k80=2).jobs(2).build()
    ids = add_server(s, "v100", 2, GAVEL, RATES)
    assert ids == [2, 3] and s.gpus == {"k80": 2, "v100": 2} and s.servers["v100"] == [[2, 3]]
    assert s.needs_allocation
    for ledger in s.entries.values():
        assert ledger.received_s["v100"] == 180.0 and ledger.deficit_s["v100"] == 0.0
        assert ledger.throughputs["v100"][0] > 0
    assert s.type_time_s["v100"] == 180.0 * len(s.entries)
    assert add_server(s, "v100", 1, GAVEL, RATES) == [4] and s.gpus["v100"] == 3
