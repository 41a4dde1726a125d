"""place: concrete workers per picked entry (docs/gavel-semantics.md section 6.2)."""

from __future__ import annotations

import random

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


# -- the plain definition (place as it was before it was made fast), against random picks ------


def reference_place(s, picked, order, settings, forced=frozenset()):
    """Gavel's placement written plainly: each type's servers copied and popped from the front;
    under extensions first, every server's free workers listed before the first fresh entry."""
    assignment = {}
    for w in order:
        entries = sorted(picked.get(w, ()), key=lambda p: p[1], reverse=True)
        if not entries:
            continue
        if settings.extensions_first:
            used, fresh = set(), []
            for entry, size in entries:
                previous = s.previous_assignment.get(entry)
                if previous is not None and previous.accelerator_type == w and used.isdisjoint(previous.worker_ids):
                    assignment[entry] = previous
                    used.update(previous.worker_ids)
                else:
                    fresh.append((entry, size))
            free = [[g for g in server if g not in used] for server in s.servers[w]]
            first = 0
            for entry, size in fresh:
                if entry not in s.allocation and not settings.run_unallocated and entry not in forced:
                    continue
                while first < len(free) and not free[first]:
                    first += 1
                room = next((k for k in range(first, len(free)) if len(free[k]) >= size), None) if size > 1 else first
                workers = []
                if room is not None and room < len(free):
                    workers, free[room] = free[room][:size], free[room][size:]
                k = first
                while len(workers) < size:
                    if k >= len(free):
                        raise RuntimeError("no free worker")
                    take = free[k][: size - len(workers)]
                    free[k] = free[k][len(take):]
                    workers += take
                    k += 1
                assignment[entry] = Placement(w, tuple(workers))
            continue
        servers = [list(server) for server in s.servers[w]]
        cursor, used = 0, set()
        for size in sorted({size for _, size in entries}, reverse=True):
            for entry, _ in (p for p in entries if p[1] == size):
                previous = s.previous_assignment.get(entry)
                if previous is not None and previous.accelerator_type == w and not used & set(previous.worker_ids):
                    assignment[entry] = previous
                    used.update(previous.worker_ids)
            for entry, scale_factor in (p for p in entries if p[1] == size):
                if entry in assignment:
                    continue
                if entry not in s.allocation and not settings.run_unallocated and entry not in forced:
                    continue
                workers = []
                while len(workers) < scale_factor:
                    if cursor >= len(servers):
                        raise RuntimeError("no free worker")
                    if not servers[cursor]:
                        cursor += 1
                        continue
                    worker = servers[cursor].pop(0)
                    if worker not in used:
                        workers.append(worker)
                assignment[entry] = Placement(w, tuple(workers))
                used.update(workers)
    return assignment


@pytest.mark.parametrize("settings", [GAVEL, DEFAULT], ids=["gavel", "extensions-first"])
def test_place_is_the_plain_definition_on_random_picks(settings):
    """Random gangs of 1, 2 and 4 on servers of 1, 2 and 4 GPUs, some extending last round's
    leases (some of whose workers a larger gang takes first), some outside the allocation."""
    moved = extended = 0
    for seed in range(300):
        rng = random.Random(seed)
        per_server = rng.choice((1, 2, 4))
        s = state(per_server, k80=8, v100=8).jobs(12).build()
        for index in s.jobs:
            if rng.random() < 0.8:
                s.allocation[(index,)] = {"k80": 0.5}
        picked, left = {"k80": [], "v100": []}, {"k80": 8, "v100": 8}
        for index in rng.sample(list(s.jobs), len(s.jobs)):
            w, size = rng.choice(("k80", "v100")), rng.choice((1, 1, 1, 2, 4))
            if size <= left[w]:
                left[w] -= size
                picked[w].append(((index,), size))
                if rng.random() < 0.5:  # it ran last round, on workers some other entry may take
                    first = rng.randrange(0, 8 - size + 1) + (0 if w == "k80" else 8)
                    s.previous_assignment[(index,)] = Placement(rng.choice((w, w, "v100")), tuple(range(first, first + size)))
        order = rng.sample(["k80", "v100"], 2)
        expected = reference_place(s, picked, order, settings)
        assert list(place(s, picked, order, settings).items()) == list(expected.items()), seed
        extended += sum(s.previous_assignment.get(e) is p for e, p in expected.items())
        moved += sum(s.previous_assignment.get(e) not in (None, p) for e, p in expected.items())
    assert extended > 300 and moved > 100
