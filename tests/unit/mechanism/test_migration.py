"""Migration-aware rounds (core/migration.py, docs/mechanism.md "What a move costs"): what a move
costs, which running entries keep their GPUs, moves charged in the priorities, and placement that
extends every gang size before placing any afresh."""

from __future__ import annotations

import copyreg
import io
import pickle
from dataclasses import replace

import pytest

from common.errors import ConfigError
from mechanism_service.core.migration import (
    charge_moves,
    fit_held,
    held_entries,
    move_cost_s,
    next_stretches,
    note_move_cost,
)
from mechanism_service.core.model import EntryLedger, JobState, Placement
from mechanism_service.core.planning.placement import place
from mechanism_service.core.planning.priority import priority_rows
from mechanism_service.core.rounds import open_round
from mechanism_service.core.settings import DEFAULT_MOVE_OVERHEAD_SHARE, MechanismSettings
from tests.unit.mechanism.builders import DEFAULT, GAVEL, no_shuffle, state

# Holds on, moves not charged: the holds alone. 20 s restores, 1%: a stretch of 2,000 s pays.
HOLDS = replace(DEFAULT, charge_moves=False)



def test_a_move_costs_the_restore_until_workers_measured_the_job_type():
    s = state(k80=2).job("a").job("b").build()

    assert move_cost_s(s, (0,), DEFAULT) == 20.0
    note_move_cost(s, "a", 30.0)
    note_move_cost(s, "a", 50.0)
    note_move_cost(s, "a", 0.0)  # an extension measured nothing: not a move
    assert s.move_costs_by_job_type == {"a": (80.0, 2)}
    assert move_cost_s(s, (0,), DEFAULT) == 40.0  # the mean of the moves measured
    assert move_cost_s(s, (1,), DEFAULT) == 20.0


def test_a_pair_costs_what_its_slower_member_costs():
    s = state(k80=2).packing().job("a").job("b").build()
    note_move_cost(s, "b", 45.0)

    assert move_cost_s(s, (0, 1), DEFAULT) == 45.0


def held_state(stretch_rounds: int = 1, share: float = 0.5, received_s: float = 180.0 + 360.0, steps: int = 10**6):
    """Job 0 ran on k80 (worker 0) last round; the allocation gives it ``share`` of k80 and of
    v100; one reset 360 s ago (seed 180 s, then the round it ran). Type a: 1 step/s on k80."""
    return (
        state(k80=1, v100=1)
        .jobs(2, steps=steps)
        .allocate((0,), k80=share, v100=share)
        .allocate((1,), k80=0.5, v100=0.5)
        .received((0,), k80=received_s)
        .reset_at(0.0)
        .ran((0,), "k80", 0)
        .build()
    ), stretch_rounds


@pytest.mark.parametrize(
    ("stretch_rounds", "share", "received_s", "held"),
    [
        pytest.param(1, 0.5, 540.0, True, id="moved last round, owed time: held"),
        pytest.param(5, 0.5, 540.0, True, id="5 rounds (1,800 s) have not paid 20 s at 1%"),
        pytest.param(6, 0.5, 540.0, False, id="6 rounds (2,160 s) have"),
        pytest.param(1, 0.0, 540.0, False, id="the allocation gives it nothing there"),
        # owed = 0.5 x 360 - (540 + 100 - 180) = -280 s, beyond 10 moves (200 s)
        pytest.param(1, 0.5, 640.0, False, id="ahead of its share by more than 10 moves"),
        # owed = 0.5 x 360 - (540 + 10 - 180) = -190 s, within
        pytest.param(1, 0.5, 550.0, True, id="ahead by less than 10 moves"),
    ],
)
def test_a_running_entry_is_held_until_its_move_is_paid_for_and_while_it_is_owed_time(
    stretch_rounds, share, received_s, held
):
    s, rounds = held_state(stretch_rounds, share, received_s)
    s.stretch_rounds = {(0,): rounds}

    assert held_entries(s, 360.0, HOLDS) == ([((0,), "k80")] if held else [])


@pytest.mark.parametrize(("steps", "held"), [(2001, True), (1999, False)])
def test_a_job_that_finishes_before_a_stretch_would_pay_is_not_held(steps, held):
    """1% of its remaining time at 1 step/s must reach the 20 s restore."""
    s, _ = held_state(steps=steps)

    assert held_entries(s, 360.0, HOLDS) == ([((0,), "k80")] if held else [])


def test_gavels_mechanism_holds_nothing():
    s, _ = held_state()

    assert held_entries(s, 360.0, GAVEL) == []


def test_a_job_type_with_a_dearer_move_is_held_longer():
    s, _ = held_state()
    s.stretch_rounds = {(0,): 6}  # 2,160 s: paid at 20 s
    assert held_entries(s, 360.0, HOLDS) == []

    note_move_cost(s, "a", 30.0)  # 2,160 s x 1% < 30 s
    assert held_entries(s, 360.0, HOLDS) == [((0,), "k80")]


def test_holds_leave_room_for_jobs_that_never_ran_and_for_reserved_entries():
    s = state(k80=2, v100=1).jobs(4).allocate((3,), k80=0.5).build()
    for job in list(s.jobs.values())[:3]:
        job.first_run_s = 0.0  # job 3 never ran: one k80 GPU is left for it
    held = [((0,), "k80"), ((1,), "k80"), ((2,), "v100")]

    assert fit_held(s, held, []) == [((0,), "k80"), ((2,), "v100")]
    assert fit_held(s, held, [((2,), "k80")]) == []  # a profiling run took job 2 and the k80 left


def test_stretches_count_rounds_on_the_same_gpus():
    p = Placement("k80", (0,))
    assignment = {(0,): p, (1,): p, (2,): p}

    assert next_stretches({(0,): 3, (1,): 7}, assignment, frozenset({(0,)})) == {(0,): 4, (1,): 1, (2,): 1}


def test_a_move_is_charged_against_its_priority_and_its_deficit():
    s = (
        state(k80=1, v100=1)
        .jobs(2)
        .allocate((0,), k80=0.5, v100=0.5)
        .allocate((1,), k80=0.5, v100=0.5)
        .deficit((0,), k80=100.0, v100=100.0)
        .deficit((1,), k80=100.0, v100=100.0)
        .ran((0,), "k80", 0)
        .build()
    )
    rows = priority_rows(s)
    once = replace(DEFAULT, move_charge_restores=1.0)
    charged = charge_moves(s, rows, once)
    scale = (360.0 - 20.0) / 360.0

    assert charged["k80"][0] == rows["k80"][0]  # it continues there: as it was
    assert charged["v100"][0] == ((0,), rows["v100"][0][1] * scale, 80.0, 0.5)
    assert charged["k80"][1] == ((1,), rows["k80"][1][1] * scale, 80.0, 0.5)

    # the default preset charges six restores: 120 s of the round, and of the deficit
    assert DEFAULT.move_charge_restores == 6.0
    sixfold = charge_moves(s, rows, DEFAULT)
    assert sixfold["k80"][0] == rows["k80"][0]
    assert sixfold["k80"][1] == ((1,), rows["k80"][1][1] * (360.0 - 120.0) / 360.0, -20.0, 0.5)

    note_move_cost(s, "a", 40.0)  # measured: the job type's own cost
    measured = charge_moves(s, rows, once)
    assert measured["k80"][1] == ((1,), rows["k80"][1][1] * (360.0 - 40.0) / 360.0, 60.0, 0.5)


def test_a_pair_is_charged_for_both_jobs_it_restarts_and_a_charge_past_the_round_leaves_no_priority():
    s = (
        state(k80=2)
        .packing()
        .jobs(3)
        .allocate((0, 1), k80=0.5)
        .allocate((2,), k80=0.5)
        .deficit((0, 1), k80=100.0)
        .deficit((2,), k80=100.0)
        .build()
    )
    rows = priority_rows(s)
    by_entry = {row[0]: row for row in charge_moves(s, rows, DEFAULT)["k80"]}
    before = {row[0]: row for row in rows["k80"]}

    assert by_entry[(2,)][1:3] == (before[(2,)][1] * (360.0 - 120.0) / 360.0, -20.0)
    assert by_entry[(0, 1)][1:3] == (before[(0, 1)][1] * (360.0 - 240.0) / 360.0, -140.0)
    heavy = charge_moves(s, rows, replace(DEFAULT, move_charge_restores=10.0))  # 400 s for the pair
    assert {row[0]: row[1] for row in heavy["k80"]}[(0, 1)] == 0.0


def test_with_holds_a_job_stays_on_its_slower_type_instead_of_moving():
    """Job 0 ran on k80; its priority on v100 (visited first) is the highest. Gavel moves it to
    v100 and job 1 to k80 (two restores); held, both stay where they were."""

    def build():
        return (
            state(k80=1, v100=1)
            .jobs(2, steps=10**6)
            .allocate((0,), k80=0.5, v100=0.5)
            .allocate((1,), k80=0.5, v100=0.5)
            .type_time(k80=720.0, v100=720.0)
            .received((0,), k80=540.0, v100=180.0)
            .received((1,), k80=180.0, v100=540.0)
            .deficit((0,), v100=50.0)
            .reset_at(0.0)
            .settled()
            .ran((0,), "k80", 0)
            .ran((1,), "v100", 1)
            .done(0, 0, first_run_s=0.0)
            .done(1, 0, first_run_s=0.0)
            .build()
        )

    # an unrealistic tie (both priorities 4/3 on v100): Gavel's deficit tie-break moves job 0
    moved = open_round(build(), 360.0, GAVEL, no_shuffle)
    held = open_round(build(), 360.0, HOLDS, no_shuffle)

    assert moved.assignment == {(0,): Placement("v100", (1,)), (1,): Placement("k80", (0,))}
    assert moved.kept == frozenset()
    assert held.assignment == {(0,): Placement("k80", (0,)), (1,): Placement("v100", (1,))}
    assert held.kept == frozenset({(0,), (1,)})


def test_extensions_first_keeps_a_small_entry_on_its_gpu_when_a_larger_gang_starts():
    s = (
        state(gpus_per_server=2, k80=4)
        .job(scale_factor=2)
        .job()
        .allocate((0,), k80=0.5)
        .allocate((1,), k80=0.5)
        .ran((1,), "k80", 0)
        .build()
    )
    picked = {"k80": [((0,), 2), ((1,), 1)]}

    # Gavel places the gang first, on server 0, and moves job 1 off worker 0
    assert place(s, picked, ["k80"], GAVEL) == {(0,): Placement("k80", (0, 1)), (1,): Placement("k80", (2,))}
    assert place(s, picked, ["k80"], DEFAULT) == {(1,): Placement("k80", (0,)), (0,): Placement("k80", (2, 3))}


def test_the_default_preset_turns_every_piece_on_and_gavels_none():
    assert (DEFAULT.extensions_first, DEFAULT.charge_moves, DEFAULT.move_overhead_share) == (
        True, True, DEFAULT_MOVE_OVERHEAD_SHARE,
    )
    assert (GAVEL.extensions_first, GAVEL.charge_moves, GAVEL.move_overhead_share) == (False, False, None)


@pytest.mark.parametrize("field, value", [("move_overhead_share", 0.0), ("move_overhead_share", 1.5), ("move_overshoot_moves", -1.0), ("move_charge_restores", -1.0)])
def test_settings_out_of_range_are_refused(field, value):
    with pytest.raises(ConfigError, match=field):
        MechanismSettings(**{field: value})


def test_job_and_ledger_pickle_compactly_and_the_default_form_still_loads():
    """Snapshots pickle jobs and ledgers as their values; a snapshot written before (the default
    form, naming every slot) loads into the same objects."""
    job = JobState(3, "j3", "a", 2, 1.0, 500, 10.0, gpu_seconds_by_type={"k80": 5.0}, steps_done=7)
    ledger = EntryLedger({"k80": (1.0,)}, {"k80": 180.0}, {"k80": -3.5})

    class DefaultForm(pickle.Pickler):
        def reducer_override(self, obj):
            if isinstance(obj, (JobState, EntryLedger)):  # what pickle wrote for a slotted object
                slots = {name: getattr(obj, name) for name in type(obj).__slots__}
                return copyreg.__newobj__, (type(obj),), (None, slots)
            return NotImplemented

    old = io.BytesIO()
    DefaultForm(old, protocol=pickle.HIGHEST_PROTOCOL).dump([job, ledger])
    new = pickle.dumps([job, ledger], protocol=pickle.HIGHEST_PROTOCOL)

    assert pickle.loads(old.getvalue()) == [job, ledger]
    assert pickle.loads(new) == [job, ledger]
    assert len(new) < len(old.getvalue())


def test_allocated_entries_are_picked_on_every_type_before_spare_gpus_are_filled():
    # v100 is visited first. Job 0 is allocated p100 only, job 1 v100 only; v100 has a spare GPU.
    # Gavel's one pass gives job 0 the spare v100 (priority 0 there, but first in line); with
    # allocated_first job 0 runs where its allocation is, and the spare v100 stays for others.
    from mechanism_service.core.planning.picking import pick, pick_columns
    from mechanism_service.core.planning.priority import charge_move_columns, priority_columns

    s = state(v100=2, p100=1).job("a").job("a").allocate((0,), p100=0.5).allocate((1,), v100=0.5).build()
    order = ["v100", "p100"]
    one_pass = replace(DEFAULT, allocated_first=False)
    two_passes = replace(DEFAULT, allocated_first=True)

    assert pick(s, priority_rows(s), order, one_pass) == {"v100": [((1,), 1), ((0,), 1)], "p100": []}
    expected = {"v100": [((1,), 1)], "p100": [((0,), 1)]}
    assert pick(s, priority_rows(s), order, two_passes) == expected
    assert pick_columns(s, charge_move_columns(s, priority_columns(s), two_passes), order, two_passes) == expected


def test_an_entry_allocated_nowhere_still_fills_a_spare_gpu_after_the_allocated_ones():
    from mechanism_service.core.planning.picking import pick

    s = state(v100=2, p100=1).job("a").job("a").job("a").allocate((0,), p100=0.5).allocate((1,), v100=0.5).build()
    s.allocation[(2,)] = {}
    picked = pick(s, priority_rows(s), ["v100", "p100"], replace(DEFAULT, allocated_first=True))

    assert picked == {"v100": [((1,), 1), ((2,), 1)], "p100": [((0,), 1)]}
