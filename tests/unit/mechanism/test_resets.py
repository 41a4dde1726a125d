"""When the allocation is recomputed and what a reset does to the ledgers (docs/gavel-semantics.md
section 4), installing the policy's answer, and finish-time fairness's isolated clock (9.2)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from common.allocation_columns import AnswerColumns
from mechanism_service.core.model import EntryLedger
from mechanism_service.core.policy_input import advance_isolated_time
from mechanism_service.core.reducers import NewJob, admit, apply_allocation, reset_due, reset_ledgers
from tests.unit.mechanism.builders import DEFAULT, GAVEL, GAVEL_PACKED, RATES, isolated, pair, state

# The default preset's rule with Gavel's spacing: shows that "no quirk" means no quirk.
NO_QUIRK_1920 = replace(DEFAULT, min_reset_interval_s=1920.0)


@pytest.mark.parametrize(
    ("settings", "changed", "last_reset_s", "resets", "now_s", "due"),
    [
        pytest.param(GAVEL, False, 360.0, 2, 9000.0, False, id="gavel: no change, no reset"),
        pytest.param(GAVEL, True, 0.0, 0, 0.0, True, id="gavel: the first reset"),
        pytest.param(GAVEL, True, 0.0, 1, 360.0, True, id="gavel quirk: a reset at t=0 looks like none"),
        pytest.param(GAVEL, False, 0.0, 1, 360.0, False, id="gavel quirk: still needs a change"),
        pytest.param(GAVEL, True, 360.0, 2, 2279.0, False, id="gavel: 1919 s after the last reset"),
        pytest.param(GAVEL, True, 360.0, 2, 2280.0, True, id="gavel: 1920 s after the last reset"),
        pytest.param(DEFAULT, True, 360.0, 2, 360.0, True, id="default: at once after a change"),
        pytest.param(DEFAULT, False, 360.0, 2, 5000.0, False, id="default: no change, no reset"),
        pytest.param(NO_QUIRK_1920, True, 0.0, 1, 360.0, False, id="no quirk: t=0 is a reset like any"),
        pytest.param(NO_QUIRK_1920, True, 0.0, 0, 360.0, True, id="no quirk: the first reset"),
    ],
)
def test_reset_due(settings, changed, last_reset_s, resets, now_s, due):
    s = state(k80=1).job("a").reset_at(last_reset_s, resets).build()
    s.needs_allocation = changed

    assert reset_due(s, now_s, settings) is due


def test_a_trace_starting_at_zero_resets_again_at_its_first_change_then_every_1920_s_at_most():
    s = state(k80=1).job("a").build()
    due = []
    for now_s, arrives in [(0.0, False), (360.0, True), (720.0, True), (2279.0, False), (2280.0, False)]:
        if arrives:
            admit(s, NewJob(f"j{s.next_index}", "a", 1, 1000, now_s), GAVEL, RATES)
        if reset_due(s, now_s, GAVEL):
            reset_ledgers(s, now_s, GAVEL)
            s.needs_allocation = False  # the new allocation is installed
            due.append(now_s)

    assert due == [0.0, 360.0, 2280.0]  # 360: the quirk; 720's arrival waits for 360 + 1920


def test_reset_folds_the_old_allocation_into_the_deficits_and_reseeds_every_entry():
    # elapsed = 1000 - 100 = 900 s; deficit += allocation x 900 - (received - 180)
    s = (
        state(k80=1, v100=1)
        .packing()
        .jobs(2)  # entries (0,), (1,), (0, 1); the pair has received 0 s since it was created
        .reset_at(100.0, resets=1)
        .allocate((0,), k80=0.5, v100=0.25)
        .allocate((1,), k80=0.5)  # no v100 share: 0
        .received((0,), k80=430.0, v100=240.0)
        .received((1,), k80=580.0)
        .deficit((0,), k80=10.0, v100=-5.0)
        .type_time(k80=1190.0, v100=420.0)
        .build()
    )
    allocation = dict(s.allocation)

    reset_ledgers(s, 1000.0, GAVEL_PACKED)

    seeded = {"k80": 180.0, "v100": 180.0}
    assert {e: (ledger.received_s, ledger.deficit_s) for e, ledger in s.entries.items()} == {
        (0,): (seeded, {"k80": 10.0 + 450.0 - 250.0, "v100": -5.0 + 225.0 - 60.0}),  # 210, 160
        (1,): (seeded, {"k80": 450.0 - 400.0, "v100": 0.0}),  # 50, 0
        (0, 1): (seeded, {"k80": 0.0 + 180.0, "v100": 0.0 + 180.0}),  # not allocated, received -180
    }
    assert s.type_time_s == {"k80": 3 * 180.0, "v100": 3 * 180.0}
    assert (s.last_reset_s, s.resets, s.allocation) == (1000.0, 2, allocation)  # the old one stays


def test_apply_allocation_maps_job_ids_to_entries_and_zero_fills_the_rest():
    s = state(k80=1, v100=1).packing().jobs(3).build()  # (0,), (1,), (0,1), (2,), (0,2), (1,2)
    fractions = {
        ("j0",): {"k80": 0.5, "v100": 0.5},
        ("j2", "j1"): {"v100": 0.5},  # a pair in either order
        ("gone",): {"k80": 1.0},  # a job that left meanwhile
    }

    apply_allocation(s, fractions, {"j0": 2.0, "j1": 4.0, "other": 1.0}, GAVEL_PACKED, policy_state="cont-7")

    assert s.allocation == {
        (0,): {"k80": 0.5, "v100": 0.5},
        (1, 2): {"v100": 0.5},
        (1,): {},
        (0, 1): {},
        (2,): {},
        (0, 2): {},
    }
    assert (s.policy_state, s.needs_allocation) == ("cont-7", False)
    assert [j.isolated_throughput_at_last_solve for j in s.jobs.values()] == [2.0, 4.0, None]


@pytest.mark.parametrize("settings", [GAVEL_PACKED, DEFAULT, replace(GAVEL_PACKED, zero_fill_allocation=False)])
@pytest.mark.parametrize(
    ("job_ids", "pairs", "types"),
    [
        pytest.param(("j0", "j1", "j2"), [(2, 1), (0, 2)], ("k80", "v100"), id="pairs in either order"),
        pytest.param(("j2", "j0"), [], ("v100", "k80"), id="no pairs, another type order"),
        pytest.param(("j0", "j1", "j2"), [(0, 1), (1, 0)], ("k80", "v100"), id="one pair twice: the dict decides"),
        pytest.param(("j0", "gone"), [(0, 1)], ("k80", "v100"), id="a job that left: the dict decides"),
        pytest.param(("j0", "j1"), [], ("k80",), id="a type the answer does not name"),
    ],
)
def test_an_answers_columns_install_what_its_entries_install(settings, job_ids, pairs, types):
    """AnswerColumns (a policy in this process) and the same entries as job ids -> fractions (a
    reply): the same allocation, entries in the same order, and the same ledger columns."""
    rng = np.random.default_rng(len(job_ids) + len(pairs))
    columns = AnswerColumns(
        job_ids=job_ids, types=types, job_fractions=rng.random((len(job_ids), len(types))).round(3),
        pair_members=np.asarray(pairs, dtype=np.int64).reshape(-1, 2),
        pair_fractions=rng.random((len(pairs), len(types))).round(3) * [[0.0] * (len(types) - 1) + [1.0]],
    )
    installed = []
    for given in (columns, columns.fractions()):
        s = state(k80=1, v100=1).packing().jobs(3).build()
        apply_allocation(s, given, {}, settings)
        installed.append((list(s.allocation.items()), s.entries.allocation[: s.entries.rows].tolist()))
        assert s.entries.allocation_of is s.allocation
    assert installed[0] == installed[1]


def test_apply_allocation_without_zero_fill_keeps_only_the_listed_entries():
    s = state(k80=1).packing().jobs(2).allocate((1,), k80=1.0).build()

    apply_allocation(s, {("j0",): {"k80": 1.0}}, {}, replace(GAVEL_PACKED, zero_fill_allocation=False))

    assert (s.allocation, s.policy_state) == ({(0,): {"k80": 1.0}}, "")


def test_the_isolated_clock_advances_by_the_steps_done_at_the_last_solves_baseline():
    s = (
        state(k80=1)
        .jobs(4)
        .done(0, 300, isolated_time_s=10.0, steps_remaining_at_last_solve=1000, isolated_throughput_at_last_solve=2.0)
        .done(1, 0)  # never solved for
        .done(2, 100, steps_remaining_at_last_solve=950, isolated_throughput_at_last_solve=None)
        .done(3, 50, isolated_time_s=1.0, steps_remaining_at_last_solve=1000, isolated_throughput_at_last_solve=0.0)
        .build()
    )

    advance_isolated_time(s)

    assert [(j.isolated_time_s, j.steps_remaining_at_last_solve) for j in s.jobs.values()] == [
        (10.0 + (1000 - 700) / 2.0, 700),  # 160.0
        (0.0, 1000),
        (0.0, 900),  # no baseline: nothing to add
        (1.0, 950),  # a zero baseline adds nothing either
    ]


def test_a_reset_ledger_is_what_admission_seeds():
    """After a reset, every entry looks like a freshly admitted single: 180 s received."""
    s = state(k80=1).jobs(1).build()
    reset_ledgers(s, 0.0, GAVEL)

    assert s.entries == {(0,): EntryLedger({"k80": (1.0,)}, {"k80": 180.0}, {"k80": 0.0})}
