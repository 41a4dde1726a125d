"""The bus-free loop's per-round fast forms against their plain definitions on random rounds
(sim/fastpath.py): a round's leases (``dispatch_round``, single leases looked up in the run's
``full_leases``) against ``dispatch_one`` of each lease, and ``record_round`` against
``round_record(round_report(...))``; ``physics.full_lease`` against ``lease_outcome``. The
schedule must not change by a bit, so every comparison is exact."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from common.throughputs import ThroughputTable
from mechanism_service.core.model import Entry, MechanismState, Placement
from mechanism_service.core.reducers import LeaseResult
from mechanism_service.core.rounds import RoundPlan, round_report
from mechanism_service.core.settings import MechanismSettings
from sim.dispatch import FullLeases, dispatch_one, dispatch_round
from sim.fastpath import record_round, round_record
from sim.physics import full_lease, lease_outcome
from tests.support.seeds import sweep
from tests.unit.mechanism.builders import DEFAULT, state

# 50 random states under `make test`, all 200 under `make test-deep` (tests/support/seeds.py)
SEEDS = sweep(200, 50)
pytestmark = pytest.mark.deep
TYPES = ("k80", "v100")
JOB_TYPES = ("a", "b", "c")


def random_table(rng: random.Random) -> ThroughputTable:
    """Rates from none (missing: 0 steps/s) through slow (under a step a lease) to fast, some
    exactly 0.0; pairs for some type pairs."""
    def rate() -> float:
        return rng.choice((0.0, rng.uniform(1e-4, 1e-2), rng.uniform(0.1, 50.0), rng.uniform(50.0, 5000.0)))

    isolated = {
        (t, sf, w): rate() for t in JOB_TYPES for sf in (1, 2) for w in TYPES if rng.random() < 0.9
    }
    pairs = {
        (a, b, sf, w): (rate(), rate())
        for a in JOB_TYPES for b in JOB_TYPES for sf in (1, 2) for w in TYPES if rng.random() < 0.7
    }
    return ThroughputTable(TYPES, isolated, pairs)


def random_round(rng: random.Random) -> tuple[MechanismState, RoundPlan, MechanismSettings]:
    """Singles and pairs, some of them kept from last round; jobs with many steps left, a few,
    or none; a restore shorter than the lease, none, or longer than the lease."""
    builder = state(k80=8, v100=8).packing()
    for _ in range(rng.randint(1, 12)):
        builder.job(rng.choice(JOB_TYPES), steps=rng.choice((1, 50, 10**4, 10**7)), scale_factor=rng.choice((1, 1, 2)))
    s = builder.build()
    for job in s.jobs.values():
        job.steps_done = rng.randint(0, job.total_steps)
    entries: list[Entry] = [e for e in s.entries if rng.random() < 0.6]
    assignment = {
        entry: Placement(rng.choice(TYPES), tuple(range(s.jobs[entry[0]].scale_factor))) for entry in entries
    }
    kept = frozenset(e for e in entries if rng.random() < 0.4)
    plan = RoundPlan(assignment, kept, len(kept), len(entries), rng.randint(0, 5))
    settings = replace(
        DEFAULT, round_s=rng.choice((360.0, 1.0, 123.456)), restore_s=rng.choice((0.0, 7.5, DEFAULT.restore_s, 500.0))
    )
    return s, plan, settings


def reference_round(
    s: MechanismState, table: ThroughputTable, plan: RoundPlan, now_s: float, settings: MechanismSettings
) -> list[LeaseResult]:
    """The loop's dispatch as it was: ``dispatch_one`` of each lease, in the plan's order."""
    return [
        dispatch_one(s, table, entry, placement, now_s, 0.0 if entry in plan.kept else settings.restore_s, settings)
        for entry, placement in plan.assignment.items()
    ]


def test_a_rounds_leases_are_the_plain_dispatch_s():
    singles = last_leases = 0
    for seed in SEEDS:
        rng = random.Random(seed)
        table = random_table(rng)
        full_leases: FullLeases = {}
        for _ in range(3):  # rounds sharing the run's looked-up leases, as the loop does
            s, plan, settings = random_round(rng)
            settings = replace(settings, round_s=360.0)  # one lease length a run
            now_s = rng.uniform(0.0, 10**6)
            running = dispatch_round(s, table, plan, now_s, settings, full_leases)
            assert running == reference_round(s, table, plan, now_s, settings), seed
            assert [r.finish_s for r in running] == [r.finish_s for r in reference_round(s, table, plan, now_s, settings)]
            for lease in running:
                if len(lease.entry) == 1:
                    singles += 1
                    last_leases += s.jobs[lease.entry[0]].steps_remaining == lease.steps[0] > 0
    # both ways a single lease goes were taken (500 and 50 of 200 seeds)
    assert singles > len(SEEDS) * 5 // 2 and last_leases > len(SEEDS) // 4


def test_a_full_lease_is_the_lease_outcome_of_any_job_with_enough_steps_left():
    for seed in SEEDS:
        rng = random.Random(seed)
        table = random_table(rng)
        key = (rng.choice(JOB_TYPES), rng.choice((1, 2)), rng.choice(TYPES))
        lease_s, restore_s = rng.choice((360.0, 1.0, 123.456)), rng.choice((0.0, 7.5, 500.0))
        rate, steps, duration_s = full_lease(table, *key, lease_s, restore_s)
        for remaining in (steps[0], steps[0] + 1, 10**12):
            assert lease_outcome((rate,), (remaining,), lease_s, restore_s) == (steps, duration_s), seed


def test_the_round_record_is_the_reports():
    for seed in SEEDS:
        rng = random.Random(seed)
        table = random_table(rng)
        s, plan, settings = random_round(rng)
        now_s = rng.uniform(0.0, 10**6)
        running = dispatch_round(s, table, plan, now_s, settings, {})
        reset = rng.random() < 0.5
        expected = round_record(round_report(s, seed, now_s, plan, running, reset))
        assert record_round(s, seed, now_s, plan, running, reset) == expected, seed
