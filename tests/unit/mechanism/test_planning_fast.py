"""The planner's fast forms against their plain definitions on random states (core/planning/,
core/migration.py), and the columnar forms the rounds run against the row forms: the schedule
must not change by a bit, so every comparison is exact. About 1 s of CPU for
the 200 random states of `make test-deep`, a quarter for the 50 of `make test`."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from mechanism_service.core.migration import charge_moves, fit_held, held_entries, note_move_cost
from mechanism_service.core.model import Entry, MechanismState, Placement
from mechanism_service.core.planning import ledger_reads
from mechanism_service.core.planning.holds import held_columns
from mechanism_service.core.planning.picking import pick, pick_columns
from mechanism_service.core.planning.priority import (
    UNSERVED_FACTOR,
    Queues,
    charge_move_columns,
    priority_columns,
    priority_rows,
)
from mechanism_service.core.reducers import apply_allocation, withdraw_job
from tests.support.seeds import sweep
from tests.unit.mechanism.builders import DEFAULT, state

# 50 random states under `make test`, all 200 under `make test-deep` (tests/support/seeds.py)
SEEDS = sweep(200, 50)
pytestmark = pytest.mark.deep


def reference_priority_rows(state: MechanismState) -> dict[str, list[tuple[Entry, float, float, float]]]:
    """``priority_rows`` written plainly, type by type, as it was before it was made fast: the
    definition the fast form is held to."""
    rows: dict[str, list[tuple[Entry, float, float, float]]] = {}
    allocation = state.allocation
    empty: dict[str, float] = {}
    for w in state.accelerator_types:
        total_s = state.type_time_s[w]
        type_rows = []
        for entry, ledger in state.entries.items():
            share = allocation.get(entry, empty).get(w, 0.0)
            if share == 0.0 or min(ledger.throughputs[w]) <= 0.0:
                priority = 0.0
            else:
                received = ledger.received_s[w] / total_s if total_s > 0 else 0.0
                priority = share / received if received > 0 else share * UNSERVED_FACTOR
            type_rows.append((entry, priority, ledger.deficit_s[w], share))
        rows[w] = type_rows
    return rows


def random_state(seed: int) -> MechanismState:
    """Singles and pairs with random allocations (some missing, some zero), ledgers (some never
    served, some rates zero), type times (some zero), last round's leases and stretches."""
    rng = random.Random(seed)
    builder = state(k80=4, v100=4).packing()
    for _ in range(rng.randint(1, 8)):
        builder.job(rng.choice("ab"), steps=rng.randint(1, 10**6), scale_factor=rng.choice((1, 1, 2)))
    s = builder.build()
    s.type_time_s.update({w: rng.choice((0.0, rng.uniform(1.0, 10**4))) for w in s.gpus})
    for entry, ledger in s.entries.items():
        if rng.random() < 0.8:
            s.allocation[entry] = {w: rng.choice((0.0, rng.random())) for w in s.gpus if rng.random() < 0.9}
        for w in s.gpus:
            ledger.received_s[w] = rng.choice((0.0, rng.uniform(0.0, 10**4)))
            ledger.deficit_s[w] = rng.uniform(-10**3, 10**3)
            if rng.random() < 0.1:
                ledger.throughputs[w] = tuple(0.0 for _ in entry)
        if rng.random() < 0.5:
            w = rng.choice(list(s.gpus))
            s.previous_assignment[entry] = Placement(w, (rng.randrange(4),))
            s.stretch_rounds[entry] = rng.randint(1, 8)
    s.last_reset_s = rng.uniform(0.0, 10**3)
    return s


def measured_at_restore(s: MechanismState) -> MechanismState:
    """Every job type measured once at exactly the default restore: move_cost_s's per-entry path
    gives the same cost the unmeasured fast path assumes."""
    for job in s.jobs.values():
        if job.job_type not in s.move_costs_by_job_type:
            note_move_cost(s, job.job_type, DEFAULT.restore_s)
    return s


def test_priority_rows_equal_the_plain_definition_exactly():
    for seed in SEEDS:
        s = random_state(seed)
        assert priority_rows(s) == reference_priority_rows(s), seed


def test_moves_charged_alike_whether_the_cost_is_uniform_or_looked_up_per_entry():
    charged_any = 0
    for seed in SEEDS:
        fast = random_state(seed)
        rows = priority_rows(fast)
        charged = charge_moves(fast, rows, DEFAULT)
        assert charged == charge_moves(measured_at_restore(random_state(seed)), rows, DEFAULT), seed
        charged_any += charged != rows
    assert charged_any > 0  # some moves were charged


def test_holds_alike_whether_the_cost_is_uniform_or_looked_up_per_entry():
    held_any = 0
    for seed in SEEDS:
        now_s = random_state(seed).last_reset_s + 360.0
        fast = held_entries(random_state(seed), now_s, DEFAULT)
        assert fast == held_entries(measured_at_restore(random_state(seed)), now_s, DEFAULT), seed
        held_any += bool(fast)
    assert held_any > 0  # the random states exercise holds, not only their absence


# The columnar forms the rounds run (planning/: priority_columns, charge_move_columns,
# pick_columns) against the row forms above, on the same random states with some jobs removed
# (the ledgers' rows then have holes) and, for half of them, the allocation installed by
# apply_allocation (its columnar copy kept) instead of set by hand.


def columnar_state(seed: int) -> MechanismState:
    s = random_state(seed)
    rng = random.Random(seed + 1000)
    if rng.random() < 0.5:
        answer = {s.job_ids_of(e): shares for e, shares in s.allocation.items()}
        apply_allocation(s, answer, {}, DEFAULT)
    for entry, ledger in s.entries.items():  # pairs where one member cannot run
        if len(entry) == 2 and rng.random() < 0.2:
            ledger.throughputs[rng.choice(list(s.gpus))] = rng.choice(((0.0, 1.0), (1.0, 0.0)))
    for index in list(s.jobs):
        if len(s.jobs) > 1 and rng.random() < 0.3:
            withdraw_job(s, index)
    return s


def as_rows(s: MechanismState, queues: Queues) -> dict[str, list[tuple[Entry, float, float, float]]]:
    k = s.entries.column_of
    return {
        w: [
            (entry, float(queues.priority[r, k[w]]), float(queues.deficit_s[r, k[w]]), float(queues.allocation[r, k[w]]))
            for r, entry in enumerate(queues.keys)
            if entry is not None and queues.live[r]
        ]
        for w in s.accelerator_types
    }


def test_priority_columns_equal_the_row_form_exactly():
    holes = 0
    for seed in SEEDS:
        s = columnar_state(seed)
        holes += len(s.entries) < s.entries.rows
        assert as_rows(s, priority_columns(s)) == priority_rows(s), seed
    assert holes > 0  # removed entries' rows were skipped, not only absent


def test_moves_charged_on_columns_as_on_rows_measured_or_not():
    for seed in SEEDS:
        s = columnar_state(seed)
        if seed % 2:
            rng = random.Random(seed)
            for job in s.jobs.values():
                note_move_cost(s, job.job_type, rng.uniform(1.0, 400.0))
        charged = as_rows(s, charge_move_columns(s, priority_columns(s), DEFAULT))
        assert charged == charge_moves(s, priority_rows(s), DEFAULT), seed


@pytest.fixture(params=[0, 8, 10**6], ids=["numpy", "threshold-8", "lists"])
def small_rows(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """ledger_reads.SMALL_ROWS: every state planned in numpy (0), in lists (10**6), or each on its
    side of 8 rows (the random states have 1 to ~36)."""
    monkeypatch.setattr(ledger_reads, "SMALL_ROWS", request.param)
    return request.param


def test_pick_on_columns_picks_what_pick_picks(small_rows: int):
    picked_any = 0
    sides = set()
    for seed in SEEDS:
        s = columnar_state(seed)
        sides.add(s.entries.rows <= small_rows)
        rng = random.Random(seed)
        settings = replace(DEFAULT, only_allocated_run=rng.random() < 0.5)
        order = list(s.gpus)
        rng.shuffle(order)
        now_s = s.last_reset_s + 360.0
        reserved = fit_held(s, held_entries(s, now_s, settings), [])
        columns = pick_columns(s, charge_move_columns(s, priority_columns(s), settings), order, settings, reserved=reserved)
        rows = pick(s, charge_moves(s, priority_rows(s), settings), order, settings, reserved=reserved)
        assert columns == rows, seed
        picked_any += sum(len(p) for p in rows.values())
    assert picked_any > 0
    assert len(sides) == (2 if small_rows == 8 else 1)  # around the threshold, both forms ran


def test_holds_on_columns_are_the_row_form_s_measured_or_not(small_rows: int):
    held_any = 0
    sides = set()
    for seed in SEEDS:
        s = columnar_state(seed)
        if s.previous_assignment:  # (none: no holds to decide)
            sides.add(len(s.previous_assignment) <= small_rows)
        rng = random.Random(seed)
        if seed % 3 == 0:
            for job in s.jobs.values():
                note_move_cost(s, job.job_type, rng.uniform(1.0, 400.0))
        settings = replace(DEFAULT, move_overshoot_moves=rng.choice((0.0, 1.0, 10.0)))
        for job in s.jobs.values():
            job.steps_done = rng.randint(0, job.total_steps)
        now_s = s.last_reset_s + rng.uniform(0.0, 3600.0)
        rows = held_entries(s, now_s, settings)
        assert held_columns(s, now_s, settings) == rows, seed
        held_any += bool(rows)
    assert held_any > len(SEEDS) // 10  # (20 of 200 seeds)
    assert len(sides) == (2 if small_rows == 8 else 1)
