"""The planner's list forms for a few ledger rows (core/planning/: ``ledger_lists``,
``queue_lists``, and ``held_columns``, ``fit_held_columns`` and ``pick_columns`` given the lists)
against the numpy columns and the row forms, and migration.kept_and_stretches against the two
passes it fuses, on the random states of test_planning_fast.py. The schedule must not change by
a bit, so every comparison is exact."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from mechanism_service.core.migration import (
    charge_moves,
    fit_held,
    held_entries,
    kept_and_stretches,
    next_stretches,
    note_move_cost,
)
from mechanism_service.core.model import MechanismState, Placement
from mechanism_service.core.planning import ledger_reads
from mechanism_service.core.planning.holds import fit_held_columns, held_columns
from mechanism_service.core.planning.ledger_reads import ledger_lists
from mechanism_service.core.planning.picking import pick, pick_columns
from mechanism_service.core.planning.placement import kept_entries
from mechanism_service.core.planning.priority import (
    QueueLists,
    charge_move_columns,
    plan_queues,
    priority_columns,
    priority_rows,
    queue_lists,
)
from mechanism_service.core.settings import MechanismSettings
from tests.support.seeds import sweep
from tests.unit.mechanism.builders import DEFAULT
from tests.unit.mechanism.test_planning_fast import columnar_state

# 50 random states under `make test`, all 200 under `make test-deep` (tests/support/seeds.py)
SEEDS = sweep(200, 50)
pytestmark = pytest.mark.deep


def varied(seed: int) -> tuple[MechanismState, MechanismSettings]:
    """A columnar random state, some with measured move costs, and settings that charge moves
    or not, run only allocated entries or not, and overshoot by some moves."""
    s = columnar_state(seed)
    rng = random.Random(seed + 7)
    if rng.random() < 0.3:
        for job in s.jobs.values():
            note_move_cost(s, job.job_type, rng.uniform(1.0, 400.0))
    for job in s.jobs.values():
        job.steps_done = rng.randint(0, job.total_steps)
        job.first_run_s = rng.choice((None, 0.0, 360.0))
    settings = replace(
        DEFAULT,
        charge_moves=rng.random() < 0.7,
        only_allocated_run=rng.random() < 0.3,
        move_overshoot_moves=rng.choice((0.0, 1.0, 10.0)),
        move_charge_restores=rng.choice((1.0, 6.0, 30.0)),  # 30 x 20 s > a round: factors of 0
    )
    return s, settings


def test_the_lists_are_the_ledgers_columns_and_none_above_small_rows(monkeypatch):
    s, _ = varied(3)
    lists = ledger_lists(s)
    assert lists is not None
    ledgers, rows = s.entries, s.entries.rows
    assert lists.allocation == ledgers.allocation_matrix(s.allocation).ravel().tolist()
    assert lists.rates == ledgers.throughputs[:rows].ravel().tolist()
    assert lists.received_s == ledgers.received_s[:rows].ravel().tolist()
    assert lists.deficit_s == ledgers.deficit_s[:rows].ravel().tolist()
    monkeypatch.setattr(ledger_reads, "SMALL_ROWS", rows - 1)
    assert ledger_lists(s) is None


def test_queue_lists_hold_the_charged_columns_floats_for_every_candidate():
    charged = zero_factor = 0
    for seed in SEEDS:
        s, settings = varied(seed)
        lists = ledger_lists(s)
        assert lists is not None
        queues = priority_columns(s)
        if settings.charge_moves:
            queues = charge_move_columns(s, queues, settings)
        fused = queue_lists(s, settings, lists)
        for k in random.Random(seed).sample(range(len(s.entries.types)), len(s.entries.types)):  # made in any order
            served, unserved, sort_keys, candidates = fused.column(k)
            assert fused.column(k) is fused.column(k)  # made once
            runs = [r for r in range(s.entries.rows) if queues.live[r] and queues.runs[r, k]]
            assert sorted(served + unserved) == candidates == runs, seed
            assert served == [r for r in runs if queues.priority[r, k] > 0.0], seed
            assert all(sort_keys[r] is None for r in set(range(s.entries.rows)) - set(runs))
            for r in runs:
                expected = (float(queues.priority[r, k]), float(queues.deficit_s[r, k]), float(queues.allocation[r, k]))
                assert sort_keys[r] == expected, (seed, r, k)
                charged += expected[1] != s.entries.deficit_s[r, k]
                zero_factor += expected[0] == 0.0 and expected[2] != 0.0
    assert charged > len(SEEDS) // 4 and zero_factor > 0  # moves were charged (50 of 200 seeds), some to a zero priority


def test_pick_on_lists_picks_what_pick_picks():
    picked_any = 0
    for seed in SEEDS:
        s, settings = varied(seed)
        for allocated_first in (True, False):
            settings = replace(settings, allocated_first=allocated_first)
            rng = random.Random(seed)
            order = list(s.gpus)
            rng.shuffle(order)
            now_s = s.last_reset_s + 360.0
            reserved = fit_held(s, held_entries(s, now_s, settings), [])
            queues = plan_queues(s, settings, ledger_lists(s))
            assert isinstance(queues, QueueLists)
            rows = priority_rows(s)
            if settings.charge_moves:
                rows = charge_moves(s, rows, settings)
            expected = pick(s, rows, order, settings, reserved=reserved)
            assert pick_columns(s, queues, order, settings, reserved=reserved) == expected, seed
            picked_any += sum(len(p) for p in expected.values())
    assert picked_any > 0


def test_holds_and_their_fit_from_lists_are_the_row_forms():
    held_any = fitted = 0
    for seed in SEEDS:
        s, settings = varied(seed)
        rng = random.Random(seed)
        now_s = s.last_reset_s + rng.uniform(0.0, 3600.0)
        lists = ledger_lists(s)
        held = held_entries(s, now_s, settings)
        assert held_columns(s, now_s, settings, lists) == held, seed
        assert held_columns(s, now_s, settings) == held, seed  # (the gathered form, without lists)
        s.gpus = {w: rng.choice((0, 1, 2, 4)) for w in s.gpus}
        reserved = [(e, w) for e, w in held if rng.random() < 0.2]
        fitting = fit_held(s, held, reserved)
        assert fit_held_columns(s, held, reserved, lists) == fitting, seed
        held_any += bool(held)
        fitted += len(fitting)
    assert held_any > len(SEEDS) // 10 and fitted > len(SEEDS) // 40  # (20 and 5 of 200 seeds)


def test_kept_and_stretches_are_kept_entries_and_next_stretches():
    kept_any = fresh_any = 0
    for seed in SEEDS:
        s = columnar_state(seed)
        rng = random.Random(seed)
        assignment = {}
        for entry in s.entries:
            last = s.previous_assignment.get(entry)
            roll = rng.random()
            if last is not None and roll < 0.4:
                assignment[entry] = last  # the very object
            elif last is not None and roll < 0.6:
                assignment[entry] = Placement(last.accelerator_type, tuple(last.worker_ids))  # an equal one
            elif roll < 0.8:
                assignment[entry] = Placement(rng.choice(list(s.gpus)), (rng.randrange(4),))
        kept, stretches = kept_and_stretches(s.previous_assignment, s.stretch_rounds, assignment)
        assert kept == kept_entries(s, assignment), seed
        assert list(stretches.items()) == list(next_stretches(s.stretch_rounds, assignment, kept).items()), seed
        kept_any += len(kept)
        fresh_any += len(assignment) - len(kept)
    assert kept_any > len(SEEDS) // 10 and fresh_any > len(SEEDS) // 10  # (20 of 200 seeds)
