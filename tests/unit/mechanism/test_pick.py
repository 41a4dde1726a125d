"""pick: the greedy pass over the per-type queues (docs/gavel-semantics.md section 5)."""

from __future__ import annotations

from mechanism_service.core.planning.picking import pick
from mechanism_service.core.planning.priority import priorities
from tests.unit.mechanism.builders import GAVEL, GAVEL_FIFO, queue, row, state


def test_each_type_is_sorted_by_priority_deficit_allocation_descending_ties_in_admission_order():
    s = state(k80=6).jobs(6).build()
    queues = {
        "k80": [
            row((0,), 1.0),
            row((1,), 2.0),
            row((2,), 2.0, deficit_s=5.0),
            row((3,), 2.0, deficit_s=5.0, allocation=0.5),
            row((4,), 2.0),  # ties with (1,): admission order
            row((5,), 0.0, deficit_s=7.0),
        ]
    }

    assert pick(s, queues, ["k80"], GAVEL) == {
        "k80": [((3,), 1), ((2,), 1), ((1,), 1), ((4,), 1), ((0,), 1), ((5,), 1)]
    }


def test_a_gang_that_does_not_fit_is_skipped_and_smaller_entries_after_it_still_fit():
    s = (
        state(k80=4)
        .job(scale_factor=2)
        .job(scale_factor=4)
        .job(scale_factor=1)
        .job(scale_factor=2)
        .job(scale_factor=1)
        .build()
    )
    queues = {"k80": queue(s, {(0,): 5.0, (1,): 4.0, (2,): 3.0, (3,): 2.0, (4,): 1.0})}

    # (0,) takes 2 of 4; (1,) needs 4 > 2; (2,) takes 1; (3,) needs 2 > 1; (4,) takes the last
    assert pick(s, queues, ["k80"], GAVEL) == {"k80": [((0,), 2), ((2,), 1), ((4,), 1)]}


def test_a_job_is_taken_once_per_round_alone_or_in_a_pair_across_types():
    s = state(k80=2, v100=2).packing().jobs(4).build()
    # entries: (0,), (1,), (0,1), (2,), (0,2), (1,2), (3,), (0,3), (1,3), (2,3)
    queues = {
        "v100": queue(s, {(0, 1): 9.0, (0,): 8.0, (1, 2): 7.0, (2,): 6.0}),
        "k80": queue(s, {(0,): 9.0, (2, 3): 8.0, (3,): 1.0}),
    }

    assert pick(s, queues, ["v100", "k80"], GAVEL) == {
        "v100": [((0, 1), 1), ((2,), 1)],  # a pair of 1-GPU jobs shares one GPU
        "k80": [((3,), 1)],  # 0 and 2 already run; every pair left contains one of 0, 1, 2
    }


def test_an_entry_with_zero_throughput_on_a_type_is_never_picked_there():
    s = state(k80=2).packing().job("nok80").job("a").build()
    queues = {"k80": queue(s, {(0,): 5.0, (0, 1): 4.0, (1,): 1.0})}

    assert pick(s, queues, ["k80"], GAVEL) == {"k80": [((1,), 1)]}


def test_fifo_never_runs_a_zero_priority_entry_even_with_gpus_free():
    s = state(k80=3).jobs(3).build()
    queues = {"k80": queue(s, {(0,): 1.0}, deficit={(2,): 30.0})}

    assert pick(s, queues, ["k80"], GAVEL_FIFO) == {"k80": [((0,), 1)]}


def test_other_policies_fill_leftover_gpus_with_zero_priority_entries_by_deficit():
    s = state(k80=3).jobs(3).build()
    queues = {"k80": queue(s, {(0,): 1.0}, deficit={(2,): 30.0})}

    assert pick(s, queues, ["k80"], GAVEL) == {"k80": [((0,), 1), ((2,), 1), ((1,), 1)]}


def test_a_types_whole_queue_is_served_before_the_next_types():
    s = state(k80=1, v100=1).jobs(2).build()
    queues = {
        "v100": [row((0,), 1.0), row((1,), 0.5)],
        "k80": [row((0,), 100.0), row((1,), 1.0)],  # job 0 ranks far higher on k80...
    }

    # ...but v100 is visited first and takes it; there is no global queue
    assert pick(s, queues, ["v100", "k80"], GAVEL) == {"v100": [((0,), 1)], "k80": [((1,), 1)]}
    assert pick(s, queues, ["k80", "v100"], GAVEL) == {"k80": [((0,), 1)], "v100": [((1,), 1)]}


def test_priorities_feed_pick_per_type():
    """The ledgers after a reset: 3 jobs on 2 k80s, ranked by share, the third fills nothing."""
    s = (
        state(k80=2)
        .jobs(3)
        .allocate((0,), k80=0.25)
        .allocate((1,), k80=0.5)
        .allocate((2,), k80=0.25)
        .type_time(k80=540.0)
        .build()
    )

    assert pick(s, priorities(s), ["k80"], GAVEL) == {"k80": [((1,), 1), ((0,), 1)]}
