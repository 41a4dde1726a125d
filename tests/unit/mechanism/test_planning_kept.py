"""What the planner keeps in the ledgers from one round to the next (``Ledgers.derived``: the
lists of the allocation, the deficits and the rates, each type's candidate cells and charges,
the catch-up columns) against the same derived afresh, boundary after boundary of a small
cluster whose jobs arrive, run, fail, finish and are solved for again (a solve that fails too,
and measured move costs): a kept value that a change left stale would plan differently. Every
comparison is exact: the schedule must not change by a bit."""

from __future__ import annotations

import copy
import random
from dataclasses import replace

import pytest

from mechanism_service.core.migration import note_move_cost
from mechanism_service.core.model import MechanismState
from mechanism_service.core.planning import ledger_reads
from mechanism_service.core.reducers import (
    LeaseResult,
    NewJob,
    admit,
    apply_allocation,
    reset_ledgers,
)
from mechanism_service.core.rounds import (
    RoundPlan,
    begin_reset,
    close_round,
    open_round,
)
from mechanism_service.core.settings import (
    MechanismSettings,
    default_preset,
    gavel_preset,
)
from tests.unit.mechanism.builders import GAVEL, RATES, state

SETTINGS = {
    "default": default_preset("max_min_fairness_perf"),
    "default-agnostic": default_preset("max_min_fairness"),
    "default-packed": default_preset("max_min_fairness_packed"),
    "gavel": gavel_preset("max_min_fairness_perf"),
    "gavel-agnostic": gavel_preset("max_min_fairness"),
    "gavel-packed": gavel_preset("max_min_fairness_packed"),
    "gavel-fifo": gavel_preset("fifo_perf"),
}


def results_of(s: MechanismState, plan: RoundPlan, now_s: float, rng: random.Random) -> list[LeaseResult]:
    """The round's leases as simulated hardware might end them: most run the round, some finish
    their job, a few fall short of their gang (a gang failure)."""
    results = []
    for entry, placement in plan.assignment.items():
        steps = []
        for i in entry:
            left = s.jobs[i].steps_remaining
            roll = rng.random()
            steps.append(left if roll < 0.05 else 0 if roll < 0.07 else min(left, rng.randint(1, 3000)))
        results.append(LeaseResult(entry, placement, tuple(steps), now_s + rng.uniform(200.0, 360.0)))
    return results


def answer(s: MechanismState, rng: random.Random) -> dict[tuple[str, ...], dict[str, float]]:
    """An allocation as a policy might answer: a share of each type for most entries."""
    return {
        s.job_ids_of(entry): {w: rng.choice((0.0, rng.random())) for w in s.gpus}
        for entry in s.entries
        if rng.random() < 0.9
    }


def plan_of(s: MechanismState, plan: RoundPlan) -> tuple[object, ...]:
    return (
        list(plan.assignment.items()), plan.kept, plan.extended, plan.opportunities, plan.jobs_waiting,
        list(s.stretch_rounds.items()), dict(s.run_started_s),
    )


@pytest.mark.parametrize(
    ("name", "small_rows"),
    # on lists (a few rows: what the simulator's rounds read) and on numpy, where only the
    # catch-up columns are kept (the default preset's)
    [*((name, ledger_reads.SMALL_ROWS) for name in SETTINGS), ("default", 0), ("default-agnostic", 0)],
)
def test_what_the_ledgers_keep_plans_as_what_is_derived_afresh(
    name: str, small_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ledger_reads, "SMALL_ROWS", small_rows)
    planned = kept = 0
    for seed in range(3):
        rng = random.Random(seed)
        settings: MechanismSettings = SETTINGS[name]
        if name.startswith("default"):  # jobs behind now and then, or never
            settings = replace(settings, catch_up_ratio=(None, 1.05, 1.3)[seed])
        s = state(k80=4, p100=3, v100=3).build()
        plan: RoundPlan | None = None
        now_s, start_s = 0.0, 0.0
        for boundary in range(60):
            if plan is not None:  # settle last round
                results = results_of(s, plan, now_s, rng)
                start_s, now_s = now_s, max([now_s + 1.0, *(r.finish_s for r in results)])
                close_round(s, results, start_s, settings)
            if rng.random() < 0.2 or not s.jobs:  # arrivals
                for _ in range(rng.choice((1, 1, 2))):
                    job = NewJob(
                        f"j{s.next_index}", rng.choice(("a", "b", "c", "nok80")), rng.choice((1, 1, 1, 2)),
                        rng.randint(500, 20_000), now_s,
                    )
                    admit(s, job, settings, RATES)
            if seed == 2 and boundary % 7 == 3:  # a real worker measured a move
                note_move_cost(s, rng.choice(("a", "b", "c", "nok80")), rng.uniform(5.0, 60.0))
            if begin_reset(s, now_s, settings):
                if rng.random() < 0.4:  # the solve failed: the ledgers were folded, the allocation kept
                    s.needs_allocation = False
                else:
                    apply_allocation(s, answer(s, rng), {}, settings)
            kept += bool(s.entries.derived)
            fresh = copy.deepcopy(s)  # (a copy's ledgers keep nothing: every value derived afresh)
            assert not fresh.entries.derived
            draw = rng.random()
            plan = open_round(s, now_s, settings, random.Random(draw).shuffle)
            expected = open_round(fresh, now_s, settings, random.Random(draw).shuffle)
            assert plan_of(s, plan) == plan_of(fresh, expected), (name, seed, boundary)
            planned += 1
    assert planned == 180
    if small_rows:
        assert kept > 45  # the kept values were read, not only made


def test_every_change_but_a_lease_s_time_drops_what_the_ledgers_keep() -> None:
    s = state(k80=2, v100=1).jobs(2).build()
    ledgers = s.entries

    def kept() -> bool:
        ledgers.derived["probe"] = True
        return "probe" in ledgers.derived

    writes = [
        lambda: s.entries.__setitem__((2,), s.entries[(0,)]),  # a new entry
        lambda: s.entries.__delitem__((2,)),
        lambda: s.entries[(0,)].deficit_s.__setitem__("k80", 5.0),
        lambda: s.entries[(0,)].received_s.__setitem__("k80", 5.0),
        lambda: s.entries[(0,)].throughputs.__setitem__("k80", (2.0,)),
        lambda: apply_allocation(s, {("j0",): {"k80": 1.0}}, {}, GAVEL),
        lambda: reset_ledgers(s, 360.0, GAVEL),  # the deficits folded
        lambda: ledgers.allocation_matrix({(0,): {"k80": 0.5}}),  # a plain dict: gathered again
        lambda: ledgers.add_type("p100", 180.0),
    ]
    for write in writes:
        assert kept()
        write()
        assert "probe" not in ledgers.derived
    ledgers.allocation_matrix(s.allocation)  # the installed allocation's matrix gathered again
    kept()
    ledgers.received_s[0, 0] += 360.0  # settle's write: nothing kept reads the time received
    ledgers.allocation_matrix(s.allocation)  # the same allocation: its matrix as it was
    assert "probe" in ledgers.derived
