"""priorities: allocation / (time received on the type / the type's total), docs/gavel-semantics.md
section 5."""

from __future__ import annotations

from mechanism_service.core.planning.priority import UNSERVED_FACTOR, QueueRow, priorities
from mechanism_service.core.reducers import reset_ledgers
from tests.unit.mechanism.builders import GAVEL, state


def test_priority_is_the_share_over_the_fraction_of_the_types_time_received():
    s = (
        state(k80=1, v100=1)
        .job("a")  # 0: k80 360 of 720 s -> 0.5 / 0.5; v100: the type has handed out nothing yet
        .job("a")  # 1: not in the allocation
        .job("a")  # 2: allocated zero
        .job("nok80")  # 3: a share of a type it cannot run on
        .job("a")  # 4: 180 of 720 s -> 0.75 / 0.25
        .allocate((0,), k80=0.5, v100=0.25)
        .allocate((2,), k80=0.0, v100=0.0)
        .allocate((3,), k80=0.5, v100=0.5)
        .allocate((4,), k80=0.75)
        .received((0,), k80=360.0)
        .deficit((0,), k80=12.5, v100=-3.0)
        .type_time(k80=720.0, v100=0.0)
        .build()
    )

    assert priorities(s) == {
        "k80": [
            QueueRow((0,), 1.0, 12.5, 0.5),
            QueueRow((1,), 0.0, 0.0, 0.0),
            QueueRow((2,), 0.0, 0.0, 0.0),
            QueueRow((3,), 0.0, 0.0, 0.5),
            QueueRow((4,), 3.0, 0.0, 0.75),
        ],
        "v100": [
            QueueRow((0,), 0.25 * UNSERVED_FACTOR, -3.0, 0.25),  # nothing received: very large
            QueueRow((1,), 0.0, 0.0, 0.0),
            QueueRow((2,), 0.0, 0.0, 0.0),
            QueueRow((3,), 0.5 * UNSERVED_FACTOR, 0.0, 0.5),
            QueueRow((4,), 0.0, 0.0, 0.0),  # no v100 share
        ],
    }
    assert UNSERVED_FACTOR == 1e9


def test_a_pair_with_nothing_received_ranks_very_large_and_one_with_a_zero_member_ranks_zero():
    s = (
        state(k80=1)
        .packing()
        .job("a")
        .job("a")
        .job("nok80")  # pairs (0, 2) and (1, 2) have a member that cannot run on k80
        .allocate((0, 1), k80=0.25)
        .allocate((0, 2), k80=0.25)
        .type_time(k80=540.0)
        .build()
    )

    assert priorities(s) == {
        "k80": [
            QueueRow((0,), 0.0, 0.0, 0.0),
            QueueRow((1,), 0.0, 0.0, 0.0),
            QueueRow((0, 1), 0.25e9, 0.0, 0.25),
            QueueRow((2,), 0.0, 0.0, 0.0),
            QueueRow((0, 2), 0.0, 0.0, 0.25),
            QueueRow((1, 2), 0.0, 0.0, 0.0),
        ]
    }


def test_right_after_a_reset_priority_is_the_share_times_the_number_of_entries():
    s = state(k80=1).jobs(3).allocate((0,), k80=0.5).allocate((1,), k80=0.25).allocate((2,), k80=0.25).build()
    reset_ledgers(s, 0.0, GAVEL)  # each 180 of 3 x 180 s

    assert [r.priority for r in priorities(s)["k80"]] == [1.5, 0.75, 0.75]
