"""place: concrete workers per picked entry (docs/gavel-semantics.md section 6.2)."""

from __future__ import annotations

import pytest

from mechanism_service.core.model import Placement
from mechanism_service.core.planning.placement import place
from tests.unit.mechanism.builders import DEFAULT, GAVEL, state


def allocated(builder, *entries):
    for entry in entries:
        builder.allocate(entry, k80=0.0)
    return builder


def test_fresh_entries_take_the_lowest_free_workers_of_their_type_in_pick_order():
    s = allocated(state(k80=4, v100=2).jobs(5), (0,), (1,), (2,), (4,)).build()  # k80 0-3, v100 4-5
    picked = {"v100": [((4,), 1)], "k80": [((2,), 1), ((0,), 1), ((1,), 1)]}

    assert list(place(s, picked, ["v100", "k80"], GAVEL).items()) == [
        ((4,), Placement("v100", (4,))),
        ((2,), Placement("k80", (0,))),
        ((0,), Placement("k80", (1,))),
        ((1,), Placement("k80", (2,))),
    ]


def test_a_lease_is_extended_on_the_same_workers_of_the_same_type():
    s = (
        allocated(state(k80=4, v100=2).jobs(5), (0,), (1,), (2,), (4,))
        .ran((1,), "k80", 3)
        .ran((4,), "v100", 5)
        .ran((0,), "v100", 4)  # another type last round: placed afresh
        .build()
    )
    picked = {"v100": [((4,), 1)], "k80": [((2,), 1), ((0,), 1), ((1,), 1)]}

    assert list(place(s, picked, ["v100", "k80"], GAVEL).items()) == [
        ((4,), Placement("v100", (5,))),
        ((1,), Placement("k80", (3,))),  # extensions first, then fresh placements
        ((2,), Placement("k80", (0,))),
        ((0,), Placement("k80", (1,))),
    ]


def test_largest_gangs_are_placed_first_each_on_as_few_servers_as_possible():
    s = allocated(
        state(gpus_per_server=4, k80=8).job(scale_factor=2).job(scale_factor=4).jobs(2), (0,), (1,), (2,), (3,)
    ).build()
    picked = {"k80": [((0,), 2), ((2,), 1), ((1,), 4), ((3,), 1)]}

    assert list(place(s, picked, ["k80"], GAVEL).items()) == [
        ((1,), Placement("k80", (0, 1, 2, 3))),
        ((0,), Placement("k80", (4, 5))),
        ((2,), Placement("k80", (6,))),
        ((3,), Placement("k80", (7,))),
    ]


def test_fresh_pairs_of_gpus_fill_servers_around_an_extended_gang():
    s = (
        allocated(state(gpus_per_server=4, k80=8).jobs(4, scale_factor=2), (0,), (1,), (2,), (3,))
        .ran((0,), "k80", 4, 5)
        .build()
    )
    picked = {"k80": [((1,), 2), ((0,), 2), ((2,), 2), ((3,), 2)]}

    assert list(place(s, picked, ["k80"], GAVEL).items()) == [
        ((0,), Placement("k80", (4, 5))),
        ((1,), Placement("k80", (0, 1))),
        ((2,), Placement("k80", (2, 3))),
        ((3,), Placement("k80", (6, 7))),  # 4 and 5 are skipped
    ]


def test_a_larger_fresh_gang_can_take_the_workers_a_smaller_entry_held():
    s = (
        allocated(state(gpus_per_server=4, k80=4).job().job(scale_factor=2), (0,), (1,))
        .ran((0,), "k80", 0)
        .build()
    )
    picked = {"k80": [((0,), 1), ((1,), 2)]}

    assert list(place(s, picked, ["k80"], GAVEL).items()) == [
        ((1,), Placement("k80", (0, 1))),
        ((0,), Placement("k80", (2,))),
    ]


def test_gavel_places_no_picked_entry_outside_the_allocation_unless_it_extends_a_lease():
    s = allocated(state(k80=3).jobs(3), (0,)).build()
    picked = {"k80": [((1,), 1), ((0,), 1), ((2,), 1)]}

    assert place(s, picked, ["k80"], GAVEL) == {(0,): Placement("k80", (0,))}  # 1 and 2 idle a GPU each

    s.previous_assignment = {(2,): Placement("k80", (2,))}
    assert list(place(s, picked, ["k80"], GAVEL).items()) == [
        ((2,), Placement("k80", (2,))),
        ((0,), Placement("k80", (0,))),
    ]


def test_the_default_preset_runs_picked_entries_outside_the_allocation():
    s = allocated(state(k80=3).jobs(3), (0,)).build()
    picked = {"k80": [((1,), 1), ((0,), 1), ((2,), 1)]}

    assert list(place(s, picked, ["k80"], DEFAULT).items()) == [
        ((1,), Placement("k80", (0,))),
        ((0,), Placement("k80", (1,))),
        ((2,), Placement("k80", (2,))),
    ]


def test_picking_more_than_the_type_holds_is_an_error():
    s = allocated(state(k80=1).jobs(2), (0,), (1,)).build()

    with pytest.raises(RuntimeError, match=r"k80: no free worker for \(1,\)"):
        place(s, {"k80": [((0,), 1), ((1,), 1)]}, ["k80"], GAVEL)
